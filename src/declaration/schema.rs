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
    let adoption = gen.subschema_for::<Adoption>().to_value();
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
        "$defs": gen.definitions().clone()
    })
}
