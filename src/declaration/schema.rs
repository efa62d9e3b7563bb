//! `mesh-host schema`: a JSON Schema of the declaration, generated from the same structs the
//! parser uses, so the two cannot disagree about a field.

use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{json, Value};

use super::model::*;
use super::Adoption;

fn variant<T: JsonSchema>(gen: &mut SchemaGenerator, kind: Kind) -> Value {
    let mut schema = gen.subschema_for::<T>().to_value();
    // Every resource carries `id` and `type` beside its own fields; the parser takes them off
    // before the type's struct sees the rest, so they are added here in the same way.
    let name = T::schema_name();
    if let Some(def) = gen.definitions_mut().get_mut(name.as_ref()) {
        if let Some(props) = def.get_mut("properties").and_then(Value::as_object_mut) {
            props.insert("id".into(), json!({"$ref": "#/$defs/Id"}));
            props.insert("type".into(), json!({"const": kind.as_str()}));
        }
        let required = def.as_object_mut().map(|o| o.entry("required").or_insert_with(|| json!([])));
        if let Some(Value::Array(req)) = required {
            req.insert(0, json!("type"));
            req.insert(0, json!("id"));
        }
        schema = json!({"$ref": format!("#/$defs/{name}")});
    }
    json!({"if": {"properties": {"type": {"const": kind.as_str()}}}, "then": schema})
}

/// A value given and not null: `Option` fields take `null` as absent, as the parser does.
fn given(field: &str) -> Value {
    json!({"required": [field], "properties": {field: {"not": {"type": "null"}}}})
}

/// Exactly one of these fields given (and not null).
fn exactly_one(fields: &[&str]) -> Value {
    json!({"oneOf": fields.iter().map(|f| given(f)).collect::<Vec<_>>()})
}

/// Standard base64, padded, with the unused bits of the last group zero: what the `base64`
/// crate's standard engine decodes, and so what `bytes` accepts.
const BASE64: &str = "^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";

/// Adds to the generated definitions the rules that span fields (`validate::within`) and the
/// grammar of values the structs hold as plain strings, so the schema refuses what the parser
/// refuses wherever JSON Schema can say it. What it cannot say (references between resources,
/// duplicates across them, the holes in a file's content) is listed in `tests/it/schema.rs`.
fn within(defs: &mut serde_json::Map<String, Value>) {
    let mut add = |name: &str, rules: Value| {
        if let Some(def) = defs.get_mut(name).and_then(Value::as_object_mut) {
            for (key, value) in rules.as_object().into_iter().flatten() {
                def.insert(key.clone(), value.clone());
            }
        }
    };
    add(
        "File",
        json!({
            "allOf": [
                exactly_one(&["content", "bytes", "sealed"]),
                // Secrets fill holes in `content`: a file with any has content.
                {"if": {"required": ["secrets"], "properties": {"secrets": {"minProperties": 1}}},
                 "then": given("content")},
                // `into` sets keys from `content`, and owns keys where `create-once` leaves the
                // whole file alone.
                {"if": given("into"),
                 "then": {"allOf": [given("content"), {"not": {"required": ["create-once"], "properties": {"create-once": {"const": true}}}}]}}
            ]
        }),
    );
    // A source needs its digest unless `unverified` says otherwise; `unverified` goes only with
    // a source and without a digest.
    let unverified = json!({"required": ["unverified"], "properties": {"unverified": {"const": true}}});
    add(
        "Archive",
        json!({
            "allOf": [
                exactly_one(&["bytes", "source"]),
                {"if": given("source"), "then": {"anyOf": [given("digest"), unverified.clone()]}},
                {"if": unverified, "then": {"allOf": [given("source"), {"not": given("digest")}]}}
            ]
        }),
    );
    // A container is run once or on a schedule, not both.
    add(
        "Container",
        json!({"not": {"allOf": [
            {"required": ["run-once"], "properties": {"run-once": {"const": true}}},
            given("schedule"),
        ]}}),
    );
    for def in ["File", "Archive"] {
        if let Some(bytes) = defs.get_mut(def).and_then(|d| d.pointer_mut("/properties/bytes")) {
            bytes["pattern"] = json!(BASE64);
        }
    }
    // schemars says `format: uint32`, which validators need not assert: the bound is spelled out.
    if let Some(uid) = defs.get_mut("User").and_then(|d| d.pointer_mut("/properties/uid")) {
        uid["maximum"] = json!(u32::MAX);
    }
    // A service's unit is named with its suffix (`nginx.service`).
    if let Some(unit) = defs.get_mut("Service").and_then(|d| d.pointer_mut("/properties/unit")) {
        *unit = json!({"allOf": [unit.clone(), {"pattern": "\\."}]});
    }
}

/// The JSON Schema (draft 2020-12) of a version 1 declaration.
pub fn json_schema() -> Value {
    let mut gen = SchemaGenerator::default();
    gen.subschema_for::<super::Id>();
    let mut branches = Vec::new();
    for kind in Kind::ALL {
        branches.push(match kind {
            Kind::Directory => variant::<Directory>(&mut gen, kind),
            Kind::File => variant::<File>(&mut gen, kind),
            Kind::Access => variant::<Access>(&mut gen, kind),
            Kind::Package => variant::<Package>(&mut gen, kind),
            Kind::Service => variant::<Service>(&mut gen, kind),
            Kind::Container => variant::<Container>(&mut gen, kind),
            Kind::Network => variant::<Network>(&mut gen, kind),
            Kind::User => variant::<User>(&mut gen, kind),
            Kind::Archive => variant::<Archive>(&mut gen, kind),
            Kind::Process => variant::<Process>(&mut gen, kind),
            Kind::Action => variant::<Action>(&mut gen, kind),
            Kind::Opening => variant::<Opening>(&mut gen, kind),
        });
    }
    // `"adoption": null` is a declaration without adoption, as the parser reads it.
    let adoption = json!({"anyOf": [gen.subschema_for::<Adoption>().to_value(), {"type": "null"}]});
    let mut defs = gen.definitions().clone();
    within(&mut defs);
    let kinds: Vec<&str> = Kind::ALL.iter().map(|k| k.as_str()).collect();
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "mesh-host declaration",
        "type": "object",
        "additionalProperties": false,
        "required": ["version", "resources"],
        "properties": {
            "version": {"const": 1},
            "adoption": adoption,
            "resources": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["id", "type"],
                    "properties": {"type": {"enum": kinds}},
                    "allOf": branches
                }
            }
        },
        "$defs": defs
    })
}
