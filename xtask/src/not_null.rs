//! Request fields the spec leaves optional but not nullable: `null` refused.
//!
//! typify gives such a field and an optional *nullable* one the same Rust
//! type, `Option<T>`, and serde reads both absent and `null` as `None`. So a
//! create or replace given `"webhook_secret": null` read it as left out (which
//! keeps the stored secret) though the spec has no `null` for it. This pass
//! finds those fields in the spec, from every request body down through its
//! references, and marks each in the generated types to be read by
//! `sparring_server::not_null` (absent is `None`, `null` a 400 naming the
//! field). Fields with a default are not `Option`s (typify reads them with
//! the default) and refuse `null` already; nullable ones keep `null` as
//! `None`, which a `PATCH` tells apart with `BodyFields`.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{bail, Context as _, Result};
use proc_macro2::TokenStream;
use serde_json::Value;
use syn::visit_mut::VisitMut;

/// Where a field is: a component's struct, or one variant (by its tag
/// value) of a component's internally tagged enum.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Holder {
    Struct(String),
    Variant(String, String),
}

/// Marks, in `types` (typify's output for the server), every field of a
/// request body's schemas that is optional and not nullable. Fails if the
/// spec names one that typify did not make where expected.
pub fn mark(types: TokenStream, spec: &Value) -> Result<TokenStream> {
    let wanted = fields(spec)?;
    let mut file: syn::File = syn::parse2(types).context("parsing typify's output")?;
    let mut marker = Marker { wanted: &wanted, found: BTreeSet::new() };
    marker.visit_file_mut(&mut file);
    let missing: Vec<String> = wanted
        .iter()
        .flat_map(|(holder, names)| names.iter().map(move |n| (holder, n)))
        .filter(|(holder, n)| !marker.found.contains(&((*holder).clone(), (*n).clone())))
        .map(|(holder, n)| format!("{holder:?}.{n}"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "fields the spec makes optional and not nullable, not found in the generated types: {}",
            missing.join(", ")
        );
    }
    Ok(quote::quote!(#file))
}

/// The optional, not nullable fields of the schemas request bodies reach.
fn fields(spec: &Value) -> Result<BTreeMap<Holder, BTreeSet<String>>> {
    let components = spec["components"]["schemas"].as_object().context("no components.schemas")?;
    let mut todo: Vec<String> = Vec::new();
    for op in
        spec["paths"].as_object().context("no paths")?.values().filter_map(Value::as_object).flat_map(|m| m.values())
    {
        if let Some(r) = op["requestBody"]["content"]["application/json"]["schema"]["$ref"].as_str() {
            todo.push(component_name(r)?.to_string());
        }
    }
    let mut seen = BTreeSet::new();
    let mut out: BTreeMap<Holder, BTreeSet<String>> = BTreeMap::new();
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let schema = components.get(&name).with_context(|| format!("no component `{name}`"))?;
        let mut refs = Vec::new();
        if let Some(alternatives) = schema["oneOf"].as_array() {
            for alt in alternatives {
                if let Some(r) = alt["$ref"].as_str() {
                    refs.push(component_name(r)?.to_string());
                    continue;
                }
                let tag = alt["properties"]["type"]["enum"][0]
                    .as_str()
                    .with_context(|| format!("an alternative of `{name}` without a single `type` value"))?;
                let holder = Holder::Variant(name.clone(), tag.to_string());
                object(components, alt, holder, &mut out, &mut refs)?;
            }
        } else {
            object(components, schema, Holder::Struct(name.clone()), &mut out, &mut refs)?;
        }
        todo.extend(refs);
    }
    Ok(out)
}

/// Notes `schema`'s optional, not nullable properties under `holder`, and
/// the components it refers to in `refs`.
fn object(
    components: &serde_json::Map<String, Value>,
    schema: &Value,
    holder: Holder,
    out: &mut BTreeMap<Holder, BTreeSet<String>>,
    refs: &mut Vec<String>,
) -> Result<()> {
    let required: BTreeSet<&str> =
        schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let Some(properties) = schema["properties"].as_object() else { return Ok(()) };
    for (field, property) in properties {
        collect_refs(property, refs)?;
        if property["type"] == "object" && property.get("properties").is_some() {
            bail!("{holder:?}.{field} is an inline object with properties: make it a component");
        }
        if required.contains(field.as_str()) || nullable(components, property)? {
            continue;
        }
        out.entry(holder.clone()).or_default().insert(field.clone());
    }
    Ok(())
}

fn nullable(components: &serde_json::Map<String, Value>, property: &Value) -> Result<bool> {
    if property["nullable"] == true {
        return Ok(true);
    }
    // `allOf: [{$ref}]` (a reference with a description beside it), or a
    // bare reference: nullable if the component is.
    let reference = property["$ref"].as_str().or_else(|| match property["allOf"].as_array() {
        Some(all) if all.len() == 1 => all[0]["$ref"].as_str(),
        _ => None,
    });
    match reference {
        Some(r) => {
            let name = component_name(r)?;
            Ok(components.get(name).with_context(|| format!("no component `{name}`"))?["nullable"] == true)
        }
        None => Ok(false),
    }
}

/// Every component `schema` refers to, at any depth.
fn collect_refs(schema: &Value, refs: &mut Vec<String>) -> Result<()> {
    match schema {
        Value::Object(map) => {
            for (k, v) in map {
                if k == "$ref" {
                    refs.push(component_name(v.as_str().context("a `$ref` that is not a string")?)?.to_string());
                } else {
                    collect_refs(v, refs)?;
                }
            }
        }
        Value::Array(items) => {
            for v in items {
                collect_refs(v, refs)?;
            }
        }
        _ => {}
    }
    Ok(())
}

fn component_name(reference: &str) -> Result<&str> {
    reference
        .strip_prefix("#/components/schemas/")
        .with_context(|| format!("`{reference}` is not a reference to a component schema"))
}

struct Marker<'a> {
    wanted: &'a BTreeMap<Holder, BTreeSet<String>>,
    found: BTreeSet<(Holder, String)>,
}

impl Marker<'_> {
    fn mark_fields(&mut self, holder: Holder, fields: &mut syn::Fields) {
        let Some(names) = self.wanted.get(&holder) else { return };
        for field in fields.iter_mut() {
            let Some(name) = json_name(field) else { continue };
            if !names.contains(&name) {
                continue;
            }
            self.found.insert((holder.clone(), name));
            if is_option(&field.ty) {
                field.attrs.push(syn::parse_quote!(#[serde(default, deserialize_with = "crate::not_null")]));
            }
        }
    }
}

impl VisitMut for Marker<'_> {
    fn visit_item_struct_mut(&mut self, item: &mut syn::ItemStruct) {
        self.mark_fields(Holder::Struct(item.ident.to_string()), &mut item.fields);
    }

    fn visit_item_enum_mut(&mut self, item: &mut syn::ItemEnum) {
        let name = item.ident.to_string();
        for variant in &mut item.variants {
            let tag = serde_rename(&variant.attrs).unwrap_or_else(|| variant.ident.to_string());
            self.mark_fields(Holder::Variant(name.clone(), tag), &mut variant.fields);
        }
    }
}

/// The name a field has in JSON: its `#[serde(rename)]`, or its identifier.
fn json_name(field: &syn::Field) -> Option<String> {
    serde_rename(&field.attrs)
        .or_else(|| field.ident.as_ref().map(|i| i.to_string().trim_start_matches("r#").to_string()))
}

fn serde_rename(attrs: &[syn::Attribute]) -> Option<String> {
    let mut rename = None;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let _ = attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename") {
                let s: syn::LitStr = meta.value()?.parse()?;
                rename = Some(s.value());
            } else if meta.input.peek(syn::Token![=]) {
                // Another `key = value`: its value skipped.
                let _: syn::Expr = meta.value()?.parse()?;
            }
            Ok(())
        });
    }
    rename
}

fn is_option(ty: &syn::Type) -> bool {
    matches!(ty, syn::Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Option"))
}
