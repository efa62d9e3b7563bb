//! The strict reading of JSON: serde visitors that refuse a key given twice in an object
//! (serde_json keeps the last one silently), and a document's top level read flat, each resource
//! left as text for the thread that validates it.

use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// What a key given twice in one object is told. serde_json keeps the last silently; a
/// declaration that says `mode` twice means one of them by mistake, and which one is not the
/// agent's to guess (docs/decisions.md, "A key given twice in one object is refused").
pub(super) const TWICE: &str = "given twice in one object; a key may appear once";

/// The top-level object's entries in order, duplicates kept so they can be refused.
pub(super) struct TopLevel<'a>(pub(super) Vec<(String, Entry<'a>)>);

/// A top-level value: `resources` read as the texts of its elements, anything else as text.
pub(super) enum Entry<'a> {
    Resources(Listed<'a>),
    Raw(&'a RawValue),
}

/// `resources` as given: a list of texts, or what it was instead of a list.
pub(super) enum Listed<'a> {
    List(Vec<&'a RawValue>),
    Other(&'static str),
}

impl<'de> serde::Deserialize<'de> for TopLevel<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> serde::de::Visitor<'de> for Entries {
            type Value = TopLevel<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<TopLevel<'de>, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value = if key == "resources" {
                        Entry::Resources(map.next_value::<Listed<'de>>()?)
                    } else {
                        Entry::Raw(map.next_value::<&'de RawValue>()?)
                    };
                    entries.push((key, value));
                }
                Ok(TopLevel(entries))
            }
        }
        d.deserialize_map(Entries)
    }
}

impl<'de> serde::Deserialize<'de> for Listed<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Listed<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Listed<'de>, A::Error> {
                let mut list = Vec::new();
                while let Some(raw) = seq.next_element::<&'de RawValue>()? {
                    list.push(raw);
                }
                Ok(Listed::List(list))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Listed<'de>, A::Error> {
                while map.next_entry::<serde::de::IgnoredAny, serde::de::IgnoredAny>()?.is_some() {}
                Ok(Listed::Other("an object"))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Listed<'de>, E> {
                Ok(Listed::Other("a boolean"))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Listed<'de>, E> {
                Ok(Listed::Other("a number"))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Listed<'de>, E> {
                Ok(Listed::Other("a number"))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Listed<'de>, E> {
                Ok(Listed::Other("a number"))
            }
            fn visit_str<E>(self, _: &str) -> Result<Listed<'de>, E> {
                Ok(Listed::Other("a string"))
            }
            fn visit_unit<E>(self) -> Result<Listed<'de>, E> {
                Ok(Listed::Other("null"))
            }
        }
        d.deserialize_any(V)
    }
}

/// Parses one value's text as serde_json's `Value`, refusing a key given twice in any object.
/// The error is the path of the key (`env.PORT`, or `.` for the value itself) and the message.
pub(super) fn strict(raw: &RawValue) -> Result<Value, (String, String)> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    match serde_path_to_error::deserialize::<_, Strict>(&mut de) {
        Ok(Strict(v)) => Ok(v),
        Err(e) => {
            let path = e.path().to_string();
            let message = e.into_inner().to_string();
            // The duplicate's own name is in the message, between backticks; the path is the
            // object holding it.
            let key =
                message.strip_prefix('`').and_then(|rest| rest.split_once('`')).map(|(k, _)| k.to_owned());
            match (path.as_str(), key) {
                (".", Some(k)) => Err((k, TWICE.to_owned())),
                (p, Some(k)) => Err((format!("{p}.{k}"), TWICE.to_owned())),
                // serde_json's position is in this value's text, not in the document: a person
                // looking there would look in the wrong place, so the path alone says where.
                (p, None) => Err((p.to_owned(), strip_position(&message).to_owned())),
            }
        }
    }
}

/// serde_json's `Value`, built by a visitor that refuses a key given twice.
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Strict;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E>(self, b: bool) -> Result<Strict, E> {
                Ok(Strict(Value::Bool(b)))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Strict, E> {
                Ok(Strict(Value::Number(n.into())))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Strict, E> {
                Ok(Strict(Value::Number(n.into())))
            }
            fn visit_f64<E>(self, n: f64) -> Result<Strict, E> {
                Ok(Strict(serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Strict, E> {
                Ok(Strict(Value::String(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Strict, E> {
                Ok(Strict(Value::String(s)))
            }
            fn visit_unit<E>(self) -> Result<Strict, E> {
                Ok(Strict(Value::Null))
            }
            fn visit_none<E>(self) -> Result<Strict, E> {
                Ok(Strict(Value::Null))
            }
            fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Strict, D::Error> {
                <Strict as serde::Deserialize>::deserialize(d)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(Strict(v)) = seq.next_element()? {
                    out.push(v);
                }
                Ok(Strict(Value::Array(out)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
                let mut out = Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if out.contains_key(&key) {
                        return Err(serde::de::Error::custom(format!("`{key}` {TWICE}")));
                    }
                    let Strict(v) = map.next_value()?;
                    out.insert(key, v);
                }
                Ok(Strict(Value::Object(out)))
            }
        }
        d.deserialize_any(V)
    }
}

/// serde_json appends " at line X column Y" to its messages; the position is given once, in
/// the form `validate::document` uses.
pub(super) fn strip_position(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    }
}
