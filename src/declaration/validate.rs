//! From bytes to a `Declaration`: the JSON is read flat, each resource deserialised into its
//! type's struct (field rules live in the value types), then the rules that span fields and
//! resources are checked. Every problem is collected before the declaration is refused, so one
//! round trip fixes them all (docs/decisions.md, "Every problem is listed").
//!
//! The JSON is read strictly (a key given twice refused) in `json.rs`; the rules between
//! resources are in `across.rs`.

use std::collections::{BTreeSet, HashMap};

use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::across::across;
use super::error::{Problems, Refused};
use super::json::{strict, strip_position, Entry, Listed, TopLevel, TWICE};
use super::model::*;
use super::types::Id;
use super::{Adoption, Declaration, Resource, VERSIONS};

pub(super) fn parse(bytes: &[u8]) -> Result<Declaration, Refused> {
    parse_sources(&[(None, bytes)], &|_| {})
}

/// Parses several documents as one declaration: their resources in order, first document
/// first. A problem names the document it is in (when there are names) and the index there.
pub(super) fn parse_sources(
    sources: &[(Option<&str>, &[u8])],
    keep: &(dyn Fn(&mut Resource) + Sync),
) -> Result<Declaration, Refused> {
    let mut problems = Problems::new();
    // A directory emptied (by a deployment half done, or by mistake) is no declaration, not a
    // declaration of nothing: taken as the latter, it would remove everything the host made.
    // Declaring nothing is said explicitly (docs/decisions.md, "A directory source").
    if sources.is_empty() {
        problems.at(
            None,
            None,
            None,
            "no declaration: the source holds no *.json file; to declare nothing, and have what the host made removed, write {\"version\": 1, \"resources\": []}".into(),
        );
        return Err(problems.refused());
    }
    let mut raw_resources = Vec::new();
    // Where each resource came from: its document and its index there.
    let mut origin: Vec<(usize, usize)> = Vec::new();
    let mut adoption: Option<Adoption> = None;
    let mut document_problems: Vec<(usize, usize)> = Vec::new();
    for (doc, (_, bytes)) in sources.iter().enumerate() {
        let before = problems.all.len();
        let (list, adopted) = document(bytes, &mut problems);
        document_problems.push((before, problems.all.len()));
        if let Some(a) = adopted {
            match &mut adoption {
                Some(all) => all.taken.extend(a.taken),
                None => adoption = Some(a),
            }
        }
        for (local, raw) in list.into_iter().enumerate() {
            origin.push((doc, local));
            raw_resources.push(raw);
        }
    }
    let top_level = problems.all.len();

    let resources = resources_of(raw_resources, keep, &mut problems);

    // Another resource is named as the person wrote it: by its index in its own document, and
    // the document when there are several (docs/decisions.md, "A directory source").
    let name = |global: usize| match (sources.len() > 1, origin.get(global)) {
        (true, Some(&(doc, local))) => match sources[doc].0 {
            Some(file) => format!("resources[{local}] of {file}"),
            None => format!("resources[{local}]"),
        },
        _ => format!("resources[{global}]"),
    };
    across(&resources, &mut problems, &name);

    if problems.all.is_empty() {
        return Ok(Declaration::new(resources, adoption));
    }
    // Name the document of each problem, when the documents have names.
    if sources.iter().any(|(name, _)| name.is_some()) {
        for (i, p) in problems.all.iter_mut().enumerate() {
            let doc = if i < top_level {
                document_problems.iter().position(|(from, to)| (*from..*to).contains(&i))
            } else {
                p.index.map(|g| origin[g].0)
            };
            if let Some(doc) = doc {
                p.source = sources[doc].0.map(str::to_owned);
                if sources.len() > 1 {
                    p.index = p.index.map(|g| origin[g].1);
                }
            }
        }
    }
    Err(problems.refused())
}

/// Validates every resource. A large declaration is split in two halves validated on two
/// threads (each resource stands alone until `across`), then joined in order, problems
/// included, so the result is exactly what one thread would give.
///
/// The list the declaration keeps is reserved once, for every text long enough to be a
/// resource, and the first half is validated straight into it; only the second half is built
/// apart and then moved in. Grown by doubling in each half and then joined, the lists held
/// about 2.2 times the final one at once at the peak (67 MB for 30.8 at 100,000 resources):
/// do not go back to growing them (docs/memory.md, "The peak of a start").
fn resources_of(
    raw: Vec<&RawValue>,
    keep: &(dyn Fn(&mut Resource) + Sync),
    problems: &mut Problems,
) -> Vec<Resource> {
    const PARALLEL_FROM: usize = 2_000;
    let one = |start: usize, raw: Vec<&RawValue>, out: &mut Vec<Resource>| {
        let mut found = Problems::new();
        for (i, r) in raw.into_iter().enumerate() {
            let index = start + i;
            match strict(r) {
                Ok(value) => {
                    if let Some(mut r) = resource(index, r, value, &mut found) {
                        keep(&mut r);
                        out.push(r);
                    }
                }
                Err((field, message)) => {
                    let id = id_in(r);
                    let field = (field != ".").then_some(field.as_str());
                    found.at(Some(index), id.as_deref(), field, message);
                }
            }
        }
        found
    };
    let mut out = Vec::with_capacity(room(&raw));
    if raw.len() < PARALLEL_FROM {
        problems.extend(one(0, raw, &mut out));
        // The declaration keeps this list for as long as it is in force: no spare room.
        out.shrink_to_fit();
        return out;
    }
    let mut first = raw;
    let second = first.split_off(first.len() / 2);
    let split = first.len();
    let (found1, (out2, found2)) = std::thread::scope(|scope| {
        let other = scope.spawn(|| {
            let mut out2 = Vec::with_capacity(room(&second));
            let found = one(split, second, &mut out2);
            (out2, found)
        });
        let mine = one(0, first, &mut out);
        (mine, other.join().expect("validating resources does not panic"))
    });
    // Within the room reserved: no reallocation.
    out.extend(out2);
    out.shrink_to_fit();
    problems.extend(found1);
    problems.extend(found2);
    out
}

/// How many resources `raw` can hold at most: its texts at least as long as the shortest
/// resource, `{"id":"a","type":"user"}` (24 bytes). Room is not reserved for every element: a
/// list of five million numbers (10 MB) once reserved 1.3 GB of address space for resources
/// that could never be; counted so, a 10 MB list can ask for at most 400,000.
fn room(raw: &[&RawValue]) -> usize {
    const SHORTEST: usize = r#"{"id":"a","type":"user"}"#.len();
    raw.iter().filter(|r| r.get().len() >= SHORTEST).count()
}

/// The top level of one document: its resources, as text not yet parsed (each is parsed on the
/// thread that validates it), and its adoption.
fn document<'a>(bytes: &'a [u8], problems: &mut Problems) -> (Vec<&'a RawValue>, Option<Adoption>) {
    let Some(entries) = top_level(bytes, problems) else {
        return (Vec::new(), None);
    };
    let keys = Keys::of(entries);
    version(keys.version, problems);
    let adoption = adoption(keys.adoption, problems);
    let raw_resources = listed(keys.resources, problems);

    for key in keys.unknown {
        problems.at(
            None,
            None,
            Some(&key),
            "unknown key; the declaration has `version`, `resources` and `adoption`".into(),
        );
    }
    for key in keys.twice {
        problems.at(None, None, Some(&key), TWICE.into());
    }

    (raw_resources, adoption)
}

/// The document's top-level entries in order, or `None` when it is not a JSON object (said).
fn top_level<'a>(bytes: &'a [u8], problems: &mut Problems) -> Option<Vec<(String, Entry<'a>)>> {
    let not_json = |e: serde_json::Error| {
        format!("not JSON at line {}, column {}: {}", e.line(), e.column(), strip_position(&e.to_string()))
    };
    // One pass over the document: its top level read, each resource's text found (it is parsed
    // later, on the thread that validates it). A syntax error is reported with its line and
    // column; a document that is JSON but not an object, as such.
    match serde_json::from_slice::<TopLevel>(bytes) {
        Ok(TopLevel(entries)) => Some(entries),
        Err(e) if e.is_data() => {
            problems.at(
                None,
                None,
                None,
                "a declaration is a JSON object with `version` and `resources`".into(),
            );
            None
        }
        Err(e) => {
            problems.at(None, None, None, not_json(e));
            None
        }
    }
}

/// The top level's entries by key: the first of each key the declaration has, and the keys it
/// does not have or that were given again.
#[derive(Default)]
struct Keys<'a> {
    version: Option<&'a RawValue>,
    adoption: Option<&'a RawValue>,
    resources: Option<Listed<'a>>,
    /// Told after the known keys, unknown ones by name, as before duplicates were looked for.
    unknown: BTreeSet<String>,
    twice: Vec<String>,
}

impl<'a> Keys<'a> {
    fn of(entries: Vec<(String, Entry<'a>)>) -> Keys<'a> {
        let mut keys = Keys::default();
        let mut seen = BTreeSet::new();
        for (key, raw) in entries {
            if !seen.insert(key.clone()) {
                keys.twice.push(key);
                continue;
            }
            match (key.as_str(), raw) {
                ("version", Entry::Raw(raw)) => keys.version = Some(raw),
                ("adoption", Entry::Raw(raw)) => keys.adoption = Some(raw),
                ("resources", Entry::Resources(listed)) => keys.resources = Some(listed),
                _ => {
                    keys.unknown.insert(key);
                }
            }
        }
        keys
    }
}

/// A top-level value read strictly, or `None` when it cannot be (said, at `field`).
fn value_of(field: &str, raw: &RawValue, problems: &mut Problems) -> Option<Value> {
    match strict(raw) {
        Ok(v) => Some(v),
        Err((inner, message)) => {
            let at = if inner == "." { field.to_owned() } else { format!("{field}.{inner}") };
            problems.at(None, None, Some(&at), message);
            None
        }
    }
}

/// `version`: given, and one this build understands.
fn version(raw: Option<&RawValue>, problems: &mut Problems) {
    match raw.map(|raw| value_of("version", raw, problems)) {
        None => problems.at(None, None, Some("version"), "missing; this build understands version 1".into()),
        Some(None) => {}
        Some(Some(Value::Number(n))) if n.as_u64().is_some_and(|v| VERSIONS.contains(&v)) => {}
        Some(Some(other)) => problems.at(
            None,
            None,
            Some("version"),
            format!("{other} is not a version this build understands (it understands {VERSIONS:?})"),
        ),
    }
}

/// `adoption`, when given and not null.
fn adoption(raw: Option<&RawValue>, problems: &mut Problems) -> Option<Adoption> {
    match raw.and_then(|raw| value_of("adoption", raw, problems)) {
        None | Some(Value::Null) => None,
        // Not an object: said in the declaration's words, not serde's ("expected struct
        // Adoption" names a Rust type the person never wrote).
        Some(v) if !v.is_object() => {
            problems.at(
                None,
                None,
                Some("adoption"),
                format!("must be an object such as {{\"taken\": [\"web\"]}}, found {}", kind_of(&v)),
            );
            None
        }
        Some(v) => match serde_path_to_error::deserialize::<_, Adoption>(v) {
            Ok(a) => Some(a),
            Err(e) => {
                let path = e.path().to_string();
                let field = if path == "." { "adoption".to_owned() } else { format!("adoption.{path}") };
                problems.at(None, None, Some(&field), e.into_inner().to_string());
                None
            }
        },
    }
}

/// `resources`: the texts of its elements, or none when it is missing or not a list (said).
fn listed<'a>(resources: Option<Listed<'a>>, problems: &mut Problems) -> Vec<&'a RawValue> {
    match resources {
        None => {
            problems.at(None, None, Some("resources"), "missing; give a list, possibly empty".into());
            Vec::new()
        }
        Some(Listed::List(list)) => list,
        Some(Listed::Other(found)) => {
            problems.at(None, None, Some("resources"), format!("must be a list, found {found}"));
            Vec::new()
        }
    }
}

/// The id of a resource whose text could not be parsed, if it says one plainly: for naming
/// the resource in the refusal.
fn id_in(raw: &RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        id: String,
    }
    serde_json::from_str::<Named>(raw.get()).ok().map(|n| n.id).filter(|id| Id::parse(id).is_ok())
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn resource(index: usize, text: &RawValue, raw: Value, problems: &mut Problems) -> Option<Resource> {
    let at = Some(index);
    let Value::Object(mut map) = raw else {
        problems.at(at, None, None, format!("a resource is an object, found {}", kind_of(&raw)));
        return None;
    };
    // The digest is of the whole resource as declared, keys sorted (serde_json's map is ordered),
    // so it changes exactly when the declaration of this resource does.
    let digest = {
        use sha2::Digest as _;
        // Serialised straight into the hash: no copy of the resource is made.
        struct Hashing(sha2::Sha256);
        impl std::io::Write for Hashing {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.update(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut h = Hashing(sha2::Sha256::new());
        serde_json::to_writer(&mut h, &map).expect("a JSON value serialises");
        super::Digest::from_sum(h.0.finalize().into())
    };

    let id = match map.remove("id") {
        Some(Value::String(s)) => match Id::parse(&s) {
            Ok(id) => Some(id),
            Err(message) => {
                problems.at(at, None, Some("id"), message);
                None
            }
        },
        Some(other) => {
            problems.at(at, None, Some("id"), format!("must be a string, found {}", kind_of(&other)));
            None
        }
        None => {
            problems.at(at, None, Some("id"), "missing; every resource has an id".into());
            None
        }
    };
    let id_text = id.as_ref().map(|i| i.as_str().to_owned());
    let id_text = id_text.as_deref();

    let kind = match map.remove("type") {
        Some(Value::String(s)) => match Kind::parse(&s) {
            Some(k) => Some(k),
            None => {
                let known: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
                problems.at(
                    at,
                    id_text,
                    Some("type"),
                    format!("{s:?} is not a resource type; the types are {}", known.join(", ")),
                );
                None
            }
        },
        Some(other) => {
            problems.at(at, id_text, Some("type"), format!("must be a string, found {}", kind_of(&other)));
            None
        }
        None => {
            problems.at(at, id_text, Some("type"), "missing; every resource has a type".into());
            None
        }
    };
    let kind = kind?;

    let spec = match kind {
        Kind::Directory => fields(map, text, index, id_text, problems).map(Spec::Directory),
        Kind::File => fields(map, text, index, id_text, problems).map(Spec::File),
        Kind::Access => fields(map, text, index, id_text, problems).map(Spec::Access),
        Kind::Package => fields(map, text, index, id_text, problems).map(Spec::Package),
        Kind::Service => fields(map, text, index, id_text, problems).map(|s| Spec::Service(Box::new(s))),
        Kind::Container => fields(map, text, index, id_text, problems).map(|c| Spec::Container(Box::new(c))),
        Kind::Network => fields(map, text, index, id_text, problems).map(Spec::Network),
        Kind::User => fields(map, text, index, id_text, problems).map(|u| Spec::User(Box::new(u))),
        Kind::Archive => fields(map, text, index, id_text, problems).map(|a| Spec::Archive(Box::new(a))),
        Kind::Process => fields(map, text, index, id_text, problems).map(|p| Spec::Process(Box::new(p))),
        Kind::Action => fields(map, text, index, id_text, problems).map(Spec::Action),
        Kind::Opening => fields(map, text, index, id_text, problems).map(Spec::Opening),
    }?;

    within(&spec, index, id_text, problems);
    let position = u32::try_from(index).expect("fewer than 2^32 resources");
    Some(Resource { position, id: id?, spec, digest })
}

/// Deserialises a resource's own fields, naming the field that failed. serde stops at the
/// first bad field; so that one round trip fixes them all, a resource that fails is tried again
/// from its text without each field already found bad, until what is left parses, and every
/// required field it lacks is named (serde would name only the first).
///
/// A bad element of a list or a bad entry of a map (`ports[1]`, `env.PORT=8080`) is taken out
/// on its own rather than with its whole field, so a second bad port in the same list is named
/// too, at the index it was declared at. Each retry reads the resource again, so this is done
/// for the first `ONE_BY_ONE` bad elements of a field of at most `SHORT` elements; past them,
/// the next one found is named and the field dropped whole, as every other bad field is. A
/// list of a million bad ports costs two reads, not a million.
fn fields<T: DeserializeOwned + schemars::JsonSchema>(
    map: Map<String, Value>,
    text: &RawValue,
    index: usize,
    id: Option<&str>,
    problems: &mut Problems,
) -> Option<T> {
    use serde_path_to_error::Segment;
    const ONE_BY_ONE: usize = 8;
    const SHORT: usize = 1_000;

    let first = match serde_path_to_error::deserialize::<_, T>(Value::Object(map)) {
        Ok(t) => return Some(t),
        Err(e) => e,
    };
    let Ok(Value::Object(mut map)) = strict(text) else { return None };
    map.remove("id");
    map.remove("type");
    let given: BTreeSet<String> = map.keys().cloned().collect();
    // For each field elements or entries were taken out of: how many.
    let mut taken: HashMap<String, usize> = HashMap::new();
    // For each list: the declared indices of the elements taken out, so an element found bad
    // afterwards is named at the index it was declared at.
    let mut gone: HashMap<String, Vec<usize>> = HashMap::new();
    let mut error = first;
    // Bounded by the number of fields a resource has, and `ONE_BY_ONE` more for each; the cap
    // only guards against a loop.
    for _ in 0..64 {
        let segments: Vec<Segment> = error.path().iter().cloned().collect();
        let path = error.path().to_string();
        let message = error.into_inner().to_string();
        if message.starts_with("missing field `") {
            break;
        }
        match segments.as_slice() {
            [Segment::Map { key: top }, Segment::Seq { index: at }]
                if map.get(top).and_then(Value::as_array).is_some_and(|list| *at < list.len()) =>
            {
                let gone = gone.entry(top.clone()).or_default();
                let declared = (0..).filter(|i| !gone.contains(i)).nth(*at).unwrap_or(*at);
                problems.at(Some(index), id, Some(&format!("{top}[{declared}]")), message);
                let taken = taken.entry(top.clone()).or_default();
                match map.get_mut(top) {
                    Some(Value::Array(list)) if *taken < ONE_BY_ONE && list.len() <= SHORT => {
                        list.remove(*at);
                        gone.push(declared);
                        *taken += 1;
                    }
                    _ => {
                        map.remove(top);
                    }
                }
            }
            [Segment::Map { key: top }, Segment::Map { key }]
                if map.get(top).and_then(Value::as_object).is_some_and(|m| m.contains_key(key)) =>
            {
                problems.at(Some(index), id, Some(&path), message);
                let taken = taken.entry(top.clone()).or_default();
                match map.get_mut(top) {
                    Some(Value::Object(entries)) if *taken < ONE_BY_ONE && entries.len() <= SHORT => {
                        entries.remove(key);
                        *taken += 1;
                    }
                    _ => {
                        map.remove(top);
                    }
                }
            }
            // A rule over a whole list some elements were taken out of (an argv left empty) is
            // not about the list that was declared: the field is dropped without a problem.
            [Segment::Map { key: top }] if taken.contains_key(top) => {
                map.remove(top);
            }
            _ => {
                // serde reports an unknown field at the object itself, with the field's name in
                // the message; lift it into the field position so every problem reads alike.
                let named = message.strip_prefix("unknown field `").and_then(|rest| rest.split('`').next());
                let field = if path == "." { named.map(str::to_owned) } else { Some(path) };
                problems.at(Some(index), id, field.as_deref(), message);
                let top = field.as_deref().and_then(|f| f.split(['.', '[']).next());
                if top.is_none_or(|top| map.remove(top).is_none()) {
                    break;
                }
            }
        }
        // Read by reference: a retry copies nothing, however long a list is.
        let resource = Value::Object(std::mem::take(&mut map));
        let retried = serde_path_to_error::deserialize::<_, T>(&resource);
        if let Value::Object(back) = resource {
            map = back;
        }
        error = match retried {
            Ok(_) => break,
            Err(e) => e,
        };
    }
    missing_required::<T>(&given, index, id, problems);
    None
}

/// The required fields of `T` not given at all (`given`), from the type's schema, in its order.
fn missing_required<T: schemars::JsonSchema>(
    given: &BTreeSet<String>,
    index: usize,
    id: Option<&str>,
    problems: &mut Problems,
) {
    let schema = schemars::schema_for!(T);
    let required = schema.get("required").and_then(Value::as_array).into_iter().flatten();
    for field in required.filter_map(Value::as_str).filter(|f| !given.contains(*f)) {
        problems.at(Some(index), id, Some(field), format!("missing field `{field}`"));
    }
}

/// Rules between the fields of one resource. A rule about one field alone belongs to the
/// field's type, which refuses a bad value while the resource is read (`types/`), so these run
/// on a resource whose every field is already good.
///
/// One single-field rule stays here on purpose: a service's unit without a suffix. Refused
/// here, the service is still read, so what it names in `restart-on` and `reload-on` is checked
/// in the same round trip (a unit is often written bare by mistake; its references rarely are).
fn within(spec: &Spec, index: usize, id: Option<&str>, problems: &mut Problems) {
    let mut problem = |field: &str, message: String| problems.at(Some(index), id, Some(field), message);
    match spec {
        Spec::File(f) => {
            let given = [
                ("content", f.content().is_some()),
                ("bytes", f.bytes.is_some()),
                ("sealed", f.sealed.is_some()),
            ];
            if let Some((field, message)) = exactly_one("a file", &given) {
                problem(field, message);
            }
            if !f.secrets.is_empty() && f.content().is_none() {
                problem(
                    "secrets",
                    "secrets fill `${secret:NAME}` holes in `content`, and this file has no `content`".into(),
                );
            }
            for name in f.content().map(secret_holes).unwrap_or_default() {
                if !f.secrets.contains_key(name) {
                    problem(
                        "content",
                        format!("`${{secret:{name}}}` names a secret that `secrets` does not declare"),
                    );
                }
            }
            let Some(into) = f.into else { return };
            if f.create_once {
                problem("into", "`into` and `create-once` cannot be combined: the first owns keys in a file, the second leaves the whole file alone".into());
            }
            match (f.content(), into) {
                (None, _) => {
                    problem("into", "`into` sets keys from `content`, and this file has no `content`".into())
                }
                (Some(c), MergeInto::Json) => match serde_json::from_str::<Value>(c) {
                    Ok(Value::Object(members)) => {
                        // A key is named in reports and the store: it cannot be a secret
                        // (docs/decisions.md, "Secret holes in `into` content").
                        for key in members.keys().filter(|k| !secret_holes(k).is_empty()) {
                            problem("content", format!("with `\"into\"`, a `${{secret:NAME}}` hole fills a value, not a key: {key:?}"));
                        }
                    }
                    _ => {
                        problem("content", "with `\"into\": \"json\"`, content must be a JSON object".into())
                    }
                },
                (Some(c), MergeInto::Env) => {
                    for n in not_key_value(c) {
                        problem("content", format!("with `\"into\": \"env\"`, line {n} is not KEY=VALUE"));
                    }
                    for (n, line) in c.lines().enumerate() {
                        let key =
                            line.split_once('=').map(|(k, _)| k).filter(|_| !line.trim().starts_with('#'));
                        if key.is_some_and(|k| !secret_holes(k).is_empty()) {
                            problem("content", format!("with `\"into\"`, a `${{secret:NAME}}` hole fills a value, not a key (line {})", n + 1));
                        }
                    }
                }
            }
        }
        Spec::Archive(a) => {
            if let Some((field, message)) = archive(a) {
                problem(field, message);
            }
        }
        Spec::Service(s) => {
            let unit = s.unit.as_str();
            if !unit.contains('.') {
                problem(
                    "unit",
                    // The suggestion quoted as the name is, so a quote in the name cannot
                    // unpair the quotes of the message (see `Problem::new`).
                    format!(
                        "{unit:?} is not a unit name: give its suffix, such as {:?}",
                        format!("{unit}.service")
                    ),
                );
            }
        }
        Spec::Container(c) => {
            if c.run_once && c.schedule.is_some() {
                problem("schedule", "a container is either `run-once` or on a `schedule`, not both".into());
            }
        }
        Spec::Directory(_)
        | Spec::Process(_)
        | Spec::Access(_)
        | Spec::Package(_)
        | Spec::Network(_)
        | Spec::User(_)
        | Spec::Action(_)
        | Spec::Opening(_) => {}
    }
}

/// What is wrong with an archive's choice of fields, if anything: exactly one of `bytes` and
/// `source`, and a source only by its digest, or when the declaration says it accepts that
/// (docs/decisions.md, "An archive's source without a digest").
fn archive(a: &Archive) -> Option<(&'static str, String)> {
    if let Some(wrong) =
        exactly_one("an archive", &[("bytes", a.bytes.is_some()), ("source", a.source.is_some())])
    {
        return Some(wrong);
    }
    match (&a.source, &a.digest, a.unverified) {
        (Some(source), None, false) => Some((
            "digest",
            format!(
                "an archive from a `source` needs its `digest`, or whoever can write {source} chooses what root unpacks into {}: add `\"digest\": \"sha256:...\"` (`sha256sum {source}`), or `\"unverified\": true` to accept it unchecked",
                a.path
            ),
        )),
        (_, Some(_), true) => Some((
            "unverified",
            "`unverified` accepts a `source` without a `digest`, and this archive gives its `digest`: remove `unverified`".into(),
        )),
        (None, None, true) => Some((
            "unverified",
            "`unverified` is for a `source` on the machine; `bytes` are the declaration's own: remove `unverified`".into(),
        )),
        _ => None,
    }
}

/// When not exactly one of some fields is given: the field to name (the second one given, or
/// the first of them when none is) and a message saying which case it is.
fn exactly_one<'a>(what: &str, fields: &[(&'a str, bool)]) -> Option<(&'a str, String)> {
    let given: Vec<&str> = fields.iter().filter(|(_, set)| *set).map(|(name, _)| *name).collect();
    if given.len() == 1 {
        return None;
    }
    let names: Vec<String> = fields.iter().map(|(name, _)| format!("`{name}`")).collect();
    let (last, rest) = names.split_last()?;
    let case =
        if given.is_empty() { "none was given".to_owned() } else { format!("found {}", given.join(" and ")) };
    let field = given.get(1).copied().unwrap_or(fields[0].0);
    Some((field, format!("{what} has exactly one of {} or {last}; {case}", rest.join(", "))))
}

/// The lines (from 1) of an env file's text that are neither blank, a comment, nor KEY=VALUE.
fn not_key_value(content: &str) -> impl Iterator<Item = usize> + '_ {
    content.lines().enumerate().filter_map(|(n, line)| {
        let line = line.trim();
        let skipped = line.is_empty() || line.starts_with('#');
        let bad = !skipped && line.split_once('=').is_none_or(|(k, _)| k.trim().is_empty());
        bad.then_some(n + 1)
    })
}

/// The names of the `${secret:NAME}` holes in a text, in order of appearance.
pub(crate) fn secret_holes(content: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut rest = content;
    while let Some(start) = rest.find("${secret:") {
        let after = &rest[start + "${secret:".len()..];
        match after.find('}') {
            Some(end) => {
                names.push(&after[..end]);
                rest = &after[end + 1..];
            }
            None => break,
        }
    }
    names
}
