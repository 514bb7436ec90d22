//! Emits the dropshot API trait for `server/`.
//!
//! For every operation of the spec the trait gets two items:
//! - `<op>`: a required method without `#[endpoint]`, taking plain values
//!   (`caller`, then path, query and body types) and returning the success
//!   body. This is what `impl/` writes; a new or changed operation breaks its
//!   compile until it does.
//! - `<op>_endpoint`: the `#[endpoint]` dropshot registers, with a provided
//!   body that unpacks the request, applies the route bridge when the
//!   documented path had to be changed (see `routes.rs`), calls `<op>`, and
//!   stamps the request id into errors. Its `operation_id` is the spec's, so
//!   dropshot's document names operations as the spec does.
//!
//! Several operations can land on one route with one method (after the
//! bridge, `GET /reviews/calibration` and `GET /reviews/reviewers` are both
//! `GET /reviews/{id}`), and dropshot holds one endpoint per route and
//! method. Such a **shared route** gets one unpublished `shared_*_endpoint`
//! that tells its operations apart by their literal segments and calls the
//! matching `<op>`; each of those operations' `<op>_endpoint` moves to the
//! `SharedRouteDocs` trait, registered at its documented path and never
//! served, so that dropshot's document (and the drift test) still describes
//! every operation with its own parameters and bodies.

use anyhow::{bail, Context as _, Result};
use heck::{ToSnakeCase, ToUpperCamelCase};
use openapiv3::{OpenAPI, Operation, Parameter, ParameterSchemaOrContent, ReferenceOr, Schema, SchemaKind, Type};
use proc_macro2::TokenStream;
use quote::{format_ident, quote};

use crate::routes::{self, Route};

/// One operation as the generator sees it.
struct Op<'a> {
    method: &'static str,
    spec_path: String,
    op: &'a Operation,
    id: String,
    route: Route,
}

pub fn base_path(spec: &OpenAPI) -> Result<String> {
    let url = &spec.servers.first().context("the spec needs a `servers` entry")?.url;
    let after_scheme = url.split_once("://").map(|(_, rest)| rest).unwrap_or(url);
    let path = after_scheme.find('/').map(|i| &after_scheme[i..]).unwrap_or("");
    Ok(path.trim_end_matches('/').to_string())
}

fn operations(spec: &OpenAPI) -> Result<Vec<Op<'_>>> {
    let mut found = Vec::new();
    for (path, item) in spec.paths.paths.iter() {
        let item = item.as_item().with_context(|| format!("path item {path} must not be a $ref"))?;
        for (method, op) in [
            ("GET", &item.get),
            ("PUT", &item.put),
            ("POST", &item.post),
            ("DELETE", &item.delete),
            ("PATCH", &item.patch),
        ] {
            if let Some(op) = op {
                let id = op.operation_id.clone().with_context(|| format!("{method} {path} has no operationId"))?;
                found.push((method, path.clone(), op, id));
            }
        }
        if item.head.is_some() || item.options.is_some() || item.trace.is_some() {
            bail!("{path}: only GET, PUT, POST, DELETE and PATCH are supported");
        }
    }
    let paths: Vec<String> = found.iter().map(|(_, p, _, _)| p.clone()).collect();
    let routes = routes::bridge(&paths);
    Ok(found
        .into_iter()
        .zip(routes)
        .map(|((method, spec_path, op, id), route)| Op { method, spec_path, op, id, route })
        .collect())
}

fn ref_name(reference: &str) -> Result<&str> {
    reference
        .strip_prefix("#/components/schemas/")
        .with_context(|| format!("unsupported $ref {reference}: only #/components/schemas/ is supported"))
}

/// The Rust type of a component schema, as typify names it.
fn type_path(reference: &str) -> Result<TokenStream> {
    let ident = format_ident!("{}", ref_name(reference)?.to_upper_camel_case());
    Ok(quote!(types::#ident))
}

struct Param {
    name: String,
    required: bool,
    description: Option<String>,
    ty: TokenStream,
    /// `#[schemars(...)]` attributes that reproduce the spec's bounds.
    attrs: TokenStream,
    /// Bounds the endpoint checks before calling the implementation.
    range: Option<Bounds>,
}

/// An integer parameter's inclusive `(minimum, maximum)`, either optional.
type Bounds = (Option<i64>, Option<i64>);

fn param_type(name: &str, schema: &ReferenceOr<Schema>) -> Result<(TokenStream, TokenStream, Option<Bounds>)> {
    let schema = match schema {
        ReferenceOr::Reference { reference } => return Ok((type_path(reference)?, quote!(), None)),
        ReferenceOr::Item(s) => s,
    };
    Ok(match &schema.schema_kind {
        SchemaKind::Type(Type::String(s)) => {
            if !s.enumeration.is_empty() {
                bail!("parameter {name}: an enum must be a named component schema");
            }
            let attrs = match (s.min_length, s.max_length) {
                (None, None) => quote!(),
                (Some(min), None) => quote!(#[schemars(length(min = #min))]),
                (None, Some(max)) => quote!(#[schemars(length(max = #max))]),
                (Some(min), Some(max)) => quote!(#[schemars(length(min = #min, max = #max))]),
            };
            match &s.format {
                openapiv3::VariantOrUnknownOrEmpty::Item(openapiv3::StringFormat::DateTime) => {
                    (quote!(chrono::DateTime<chrono::Utc>), attrs, None)
                }
                openapiv3::VariantOrUnknownOrEmpty::Empty => (quote!(String), attrs, None),
                other => bail!("parameter {name}: unsupported string format {other:?}"),
            }
        }
        SchemaKind::Type(Type::Integer(i)) => {
            let ty = match &i.format {
                openapiv3::VariantOrUnknownOrEmpty::Item(openapiv3::IntegerFormat::Int32) => quote!(i32),
                openapiv3::VariantOrUnknownOrEmpty::Item(openapiv3::IntegerFormat::Int64) => quote!(i64),
                _ => bail!("parameter {name}: an integer needs format int32 or int64"),
            };
            if i.exclusive_minimum || i.exclusive_maximum {
                bail!("parameter {name}: exclusive bounds are not supported");
            }
            let attrs = match (i.minimum, i.maximum) {
                (None, None) => quote!(),
                (Some(min), None) => quote!(#[schemars(range(min = #min))]),
                (None, Some(max)) => quote!(#[schemars(range(max = #max))]),
                (Some(min), Some(max)) => quote!(#[schemars(range(min = #min, max = #max))]),
            };
            let range = (i.minimum.is_some() || i.maximum.is_some()).then_some((i.minimum, i.maximum));
            (ty, attrs, range)
        }
        SchemaKind::Type(Type::Boolean(_)) => (quote!(bool), quote!(), None),
        _ => bail!("parameter {name}: unsupported schema (string, integer, boolean or a $ref)"),
    })
}

fn params_of(op: &Operation, location: &str) -> Result<Vec<Param>> {
    let mut out = Vec::new();
    for p in &op.parameters {
        let p = p.as_item().context("parameters must not be $refs")?;
        let (data, here) = match p {
            Parameter::Path { parameter_data, .. } => (parameter_data, "path"),
            Parameter::Query { parameter_data, .. } => (parameter_data, "query"),
            Parameter::Header { parameter_data, .. } => (parameter_data, "header"),
            Parameter::Cookie { parameter_data, .. } => {
                bail!("cookie parameter {} is not supported", parameter_data.name)
            }
        };
        if here != location {
            continue;
        }
        let ParameterSchemaOrContent::Schema(schema) = &data.format else {
            bail!("parameter {} must have a schema", data.name);
        };
        let (ty, attrs, range) = param_type(&data.name, schema)?;
        if here == "header" && ty.to_string() != "String" {
            bail!("header parameter {}: only strings are supported", data.name);
        }
        out.push(Param {
            name: data.name.clone(),
            required: data.required,
            description: data.description.clone(),
            ty,
            attrs,
            range,
        });
    }
    Ok(out)
}

fn doc_attrs(text: &str) -> TokenStream {
    let lines = text.lines().map(|l| format!(" {l}"));
    quote!(#(#[doc = #lines])*)
}

fn field_ident(name: &str) -> proc_macro2::Ident {
    format_ident!("{}", name.to_snake_case())
}

/// A struct of parameters, as dropshot's `Path`/`Query` extract them.
/// `RouteLiterals` for the route variables `route_ty`: its path is one
/// whose literals match one of `conditions`, else `miss` answers, as
/// dropshot's router answers an unknown path (both written of `route`).
fn route_literals<'a>(
    route_ty: &proc_macro2::Ident,
    conditions: impl IntoIterator<Item = &'a TokenStream>,
    miss: &TokenStream,
) -> TokenStream {
    let conditions = conditions.into_iter();
    quote! {
        impl crate::RouteLiterals for #route_ty {
            fn check(&self) -> Result<(), dropshot::HttpError> {
                let route = self;
                if #(#conditions)||* {
                    return Ok(());
                }
                #miss
            }
        }
    }
}

fn params_struct(name: &proc_macro2::Ident, doc: &str, params: &[Param]) -> TokenStream {
    let fields = params.iter().map(|p| {
        let ident = field_ident(&p.name);
        let rename = (ident != p.name).then(|| {
            let n = &p.name;
            quote!(#[serde(rename = #n)])
        });
        let doc = p.description.as_deref().map(doc_attrs).unwrap_or_default();
        let attrs = &p.attrs;
        let ty = &p.ty;
        if p.required {
            quote!(#doc #rename #attrs pub #ident: #ty,)
        } else {
            quote!(#doc #rename #attrs #[serde(default)] pub #ident: Option<#ty>,)
        }
    });
    let doc = doc_attrs(doc);
    quote! {
        #doc
        #[derive(Clone, Debug, serde::Deserialize, schemars::JsonSchema)]
        pub struct #name { #(#fields)* }
    }
}

/// What the generated server file holds besides `types`.
pub struct ServerItems {
    pub params: TokenStream,
    pub trait_items: TokenStream,
    pub bridged: TokenStream,
    /// The `SharedRouteDocs` trait's endpoints (see the module docs).
    pub doc_items: TokenStream,
}

/// What a shared route's endpoint needs of one of its operations.
struct SharedMember {
    /// `route.<var> == "<literal>"` for each literal of the documented path.
    matches: TokenStream,
    /// Builds `path` and `query`, then answers with the operation's method.
    serve: TokenStream,
}

/// Whether the route variables (fields of `receiver`) hold the literals of
/// `route`'s documented path.
fn literals_match(route: &Route, receiver: &TokenStream) -> TokenStream {
    let each = route.literals.iter().map(|(var, lit)| {
        let f = field_ident(var);
        quote!(#receiver.#f == #lit)
    });
    quote!(#(#each)&&*)
}

/// The error for a request with `method` on `route_path` whose literals
/// match none of that method's operations: what dropshot's router answers
/// for a path it does not hold. The other methods whose operations at this
/// route take the request's path are allowed (405 with `Allow`); with none,
/// the path is not in the API (404).
fn no_route(ops: &[Op<'_>], method: &str, route_path: &str, receiver: &TokenStream) -> TokenStream {
    // Sorted by method, as dropshot lists them; `None` is any path.
    let mut others: std::collections::BTreeMap<&str, Option<Vec<TokenStream>>> = std::collections::BTreeMap::new();
    for op in ops.iter().filter(|o| o.method != method && o.route.route_path == route_path) {
        let entry = others.entry(op.method).or_insert_with(|| Some(Vec::new()));
        match (op.route.literals.is_empty(), entry.as_mut()) {
            (true, _) => *entry = None,
            (false, Some(conditions)) => conditions.push(literals_match(&op.route, receiver)),
            (false, None) => {}
        }
    }
    if others.is_empty() {
        return quote!(Err(crate::no_route(&[])));
    }
    let pushes = others.iter().map(|(m, conditions)| match conditions {
        None => quote!(allow.push(#m);),
        Some(c) => quote! {
            if #(#c)||* {
                allow.push(#m);
            }
        },
    });
    quote! {
        let mut allow = Vec::new();
        #(#pushes)*
        Err(crate::no_route(&allow))
    }
}

pub fn generate(spec: &OpenAPI) -> Result<ServerItems> {
    let base = base_path(spec)?;
    let ops = operations(spec)?;
    let mut params = Vec::new();
    let mut trait_items = Vec::new();
    let mut bridged = Vec::new();
    let mut doc_items = Vec::new();

    // dropshot registers one endpoint per (method, route). Operations that
    // share one are served by one endpoint that tells them apart by their
    // literal segments, so each must have some, and none may take a body
    // (the shared endpoint reads path and query only).
    let mut groups: std::collections::BTreeMap<(&str, String), Vec<usize>> = std::collections::BTreeMap::new();
    for (i, op) in ops.iter().enumerate() {
        groups.entry((op.method, op.route.route_path.clone())).or_default().push(i);
    }
    let mut shared_of: Vec<Option<(&str, String)>> = vec![None; ops.len()];
    for (key, members) in groups.iter().filter(|(_, m)| m.len() > 1) {
        let names: Vec<&str> = members.iter().map(|&i| ops[i].id.as_str()).collect();
        for &i in members {
            let op = &ops[i];
            if op.route.literals.is_empty() {
                bail!(
                    "{} shares {} {} with {:?} but has no literal segment to be told apart by",
                    op.id,
                    key.0,
                    key.1,
                    names
                );
            }
            if op.op.request_body.is_some() {
                bail!(
                    "{} shares {} {} with {:?}: a shared route cannot take a request body yet",
                    op.id,
                    key.0,
                    key.1,
                    names
                );
            }
            shared_of[i] = Some(key.clone());
        }
    }
    let mut shared_members: std::collections::BTreeMap<(&str, String), Vec<SharedMember>> =
        std::collections::BTreeMap::new();

    for (index, op) in ops.iter().enumerate() {
        let o = op.op;
        let id = &op.id;
        let pascal = id.to_upper_camel_case();
        let method_ident = format_ident!("{}", id.to_snake_case());
        let endpoint_ident = format_ident!("{}_endpoint", id.to_snake_case());
        let summary = o.summary.clone().unwrap_or_default();
        let mut doc = summary.clone();
        if let Some(d) = &o.description {
            doc.push_str("\n\n");
            doc.push_str(d);
        }
        let doc_tokens = doc_attrs(&doc);

        // Path parameters: the operation's own struct, and for a bridged
        // route the struct of the route's variables.
        let path_params = params_of(o, "path")?;
        let query_params = params_of(o, "query")?;
        let header_params = params_of(o, "header")?;
        let path_ty = format_ident!("{pascal}Path");
        let query_ty = format_ident!("{pascal}Query");
        let header_ty = format_ident!("{pascal}Headers");
        let route_ty = format_ident!("{pascal}Route");
        if !path_params.is_empty() {
            params.push(params_struct(
                &path_ty,
                &format!("Path parameters of `{id}` ({} {}).", op.method, op.spec_path),
                &path_params,
            ));
        }
        if !query_params.is_empty() {
            params.push(params_struct(&query_ty, &format!("Query parameters of `{id}`."), &query_params));
        }
        if !header_params.is_empty() {
            if shared_of[index].is_some() {
                bail!("{id}: an operation on a shared route cannot take header parameters yet");
            }
            params.push(params_struct(&header_ty, &format!("Header parameters of `{id}`."), &header_params));
        }
        let route = &op.route;
        if route.is_bridged() {
            let mut route_params: Vec<Param> = route
                .literals
                .iter()
                .map(|(var, lit)| Param {
                    name: var.clone(),
                    required: true,
                    description: Some(format!("Always `{lit}` (the documented path's literal segment).")),
                    ty: quote!(String),
                    attrs: quote!(),
                    range: None,
                })
                .collect();
            for (var, spec_name) in &route.variables {
                let p = path_params.iter().find(|p| &p.name == spec_name).with_context(|| {
                    format!("{id}: path variable {{{spec_name}}} is not declared as a path parameter")
                })?;
                route_params.push(Param {
                    name: var.clone(),
                    required: true,
                    description: p.description.clone(),
                    ty: p.ty.clone(),
                    attrs: quote!(),
                    range: None,
                });
            }
            // Keep the order of the route's segments.
            let order: Vec<&str> = route
                .route_path
                .split('/')
                .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
                .collect();
            route_params.sort_by_key(|p| order.iter().position(|o| *o == p.name));
            params.push(params_struct(
                &route_ty,
                &format!(
                    "The route variables serving `{id}` ({} {} is routed as {}).",
                    op.method, op.spec_path, route.route_path
                ),
                &route_params,
            ));
            if !route.literals.is_empty() && shared_of[index].is_none() {
                let matches = literals_match(route, &quote!(route));
                let miss = no_route(&ops, op.method, &route.route_path, &quote!(route));
                params.push(route_literals(&route_ty, [&matches], &miss));
            }
            let literals = route.literals.iter().map(|(v, l)| quote!((#v, #l)));
            let renames = route.renames.iter().map(|(v, s)| quote!((#v, #s)));
            let method = op.method;
            let spec_path = format!("{base}{}", op.spec_path);
            let route_path = format!("{base}{}", route.route_path);
            bridged.push(quote! {
                BridgedRoute {
                    operation_id: #id,
                    method: #method,
                    spec_path: #spec_path,
                    route_path: #route_path,
                    literals: &[#(#literals),*],
                    renames: &[#(#renames),*],
                }
            });
        }

        // Body.
        let (body_extractor, body_arg) = match &o.request_body {
            None => (quote!(Nothing), None),
            Some(ReferenceOr::Reference { .. }) => bail!("{id}: request bodies must be inline with a schema $ref"),
            Some(ReferenceOr::Item(body)) => {
                if op.method == "PATCH" && !body.required {
                    bail!("{id}: a PATCH body must be required");
                }
                let media = body
                    .content
                    .get("application/json")
                    .with_context(|| format!("{id}: only application/json request bodies are supported"))?;
                let Some(ReferenceOr::Reference { reference }) = &media.schema else {
                    bail!("{id}: the request body schema must be a $ref to a component");
                };
                let ty = type_path(reference)?;
                if body.required {
                    (quote!(JsonBody<#ty>), Some(quote!(body: #ty)))
                } else {
                    (quote!(OptionalJsonBody<#ty>), Some(quote!(body: Option<#ty>)))
                }
            }
        };

        // Responses: one success with a $ref body, errors all of one schema.
        let mut success = None;
        let mut error_schema: Option<String> = None;
        for (status, response) in o.responses.responses.iter() {
            let response = response.as_item().with_context(|| format!("{id}: responses must be inline"))?;
            let code = match status {
                openapiv3::StatusCode::Code(c) => *c,
                openapiv3::StatusCode::Range(_) => bail!("{id}: use explicit status codes"),
            };
            let media = response
                .content
                .get("application/json")
                .with_context(|| format!("{id}: response {code} needs an application/json schema"))?;
            let Some(ReferenceOr::Reference { reference }) = &media.schema else {
                bail!("{id}: response {code} schema must be a $ref to a component");
            };
            if (200..300).contains(&code) {
                if success.replace((code, reference.clone())).is_some() {
                    bail!("{id}: exactly one success response is supported");
                }
            } else if let Some(existing) = &error_schema {
                if existing != reference {
                    bail!("{id}: every error response must use the same schema ({existing} vs {reference})");
                }
            } else {
                error_schema = Some(reference.clone());
            }
        }
        let (status, success_ref) = success.with_context(|| format!("{id}: no success response"))?;
        let success_ty = type_path(&success_ref)?;
        let error_ty = type_path(&error_schema.with_context(|| format!("{id}: no error response"))?)?;
        if !(200..=202).contains(&status) {
            bail!("{id}: success status {status} is not supported");
        }
        // `Reply` documents what dropshot's `HttpResponseOk` (`Created`,
        // `Accepted`) would, and also carries bodies already written as JSON.
        let status_lit = proc_macro2::Literal::u16_unsuffixed(status);
        let reply_ty = quote!(Reply<#success_ty, #status_lit>);

        // The implementation's method.
        let path_extractor = if !route.literals.is_empty() {
            quote!(RoutePath<params::#route_ty>)
        } else if route.is_bridged() {
            quote!(dropshot::Path<params::#route_ty>)
        } else if path_params.is_empty() {
            quote!(Nothing)
        } else {
            quote!(dropshot::Path<params::#path_ty>)
        };
        let query_extractor = if query_params.is_empty() { quote!(Nothing) } else { quote!(Query<params::#query_ty>) };
        // The headers' extractor, after `Input`'s other three (it defaults to
        // `Nothing`).
        let header_extractor = if header_params.is_empty() { quote!() } else { quote!(, Headers<params::#header_ty>) };
        let mut impl_args = Vec::new();
        let mut call_args = Vec::new();
        if !path_params.is_empty() {
            impl_args.push(quote!(path: params::#path_ty));
            call_args.push(quote!(path));
        }
        if !query_params.is_empty() {
            impl_args.push(quote!(query: params::#query_ty));
            call_args.push(quote!(query));
        }
        if !header_params.is_empty() {
            impl_args.push(quote!(headers: params::#header_ty));
            call_args.push(quote!(headers));
        }
        // A PATCH merges: its method also learns which fields were sent.
        let merge = op.method == "PATCH" && body_arg.is_some();
        if let Some(arg) = &body_arg {
            impl_args.push(arg.clone());
            call_args.push(quote!(body));
            if merge {
                impl_args.push(quote!(fields: BodyFields));
                call_args.push(quote!(fields));
            }
        }
        let impl_doc = doc_attrs(&format!(
            "{summary}\n\nImplements `{id}` ({} {}); dropshot calls it through `{endpoint_ident}`.",
            op.method, op.spec_path
        ));
        trait_items.push(quote! {
            #impl_doc
            fn #method_ident(
                rqctx: dropshot::RequestContext<Self::Context>,
                caller: Caller,
                #(#impl_args),*
            ) -> impl std::future::Future<Output = Result<Json<#success_ty>, ApiError<#error_ty>>> + Send;
        });

        // The endpoint. A bridged route's literals were checked by
        // `RoutePath` as it was extracted (before the query and the body);
        // here its variables get their documented names back.
        let unpack_path = if route.is_bridged() {
            let fields = route.variables.iter().map(|(var, spec_name)| {
                let to = field_ident(spec_name);
                let from = field_ident(var);
                quote!(#to: route.#from)
            });
            if path_params.is_empty() {
                quote!()
            } else {
                quote! {
                    let route = input.path.into_inner();
                    let path = params::#path_ty { #(#fields),* };
                }
            }
        } else if path_params.is_empty() {
            quote!()
        } else {
            quote!(let path = input.path.into_inner();)
        };
        let (unpack_query, query_checks) = if query_params.is_empty() {
            (quote!(), quote!())
        } else {
            let checks = query_params.iter().filter_map(|p| {
                let (min, max) = p.range?;
                let f = field_ident(&p.name);
                let name = &p.name;
                let value = if p.required { quote!(Some(query.#f)) } else { quote!(query.#f) };
                let cond_min = min.map(|m| quote!(v < #m)).unwrap_or(quote!(false));
                let cond_max = max.map(|m| quote!(v > #m)).unwrap_or(quote!(false));
                let bounds = match (min, max) {
                    (Some(a), Some(b)) => format!("from {a} to {b}"),
                    (Some(a), None) => format!("at least {a}"),
                    (None, Some(b)) => format!("at most {b}"),
                    (None, None) => String::new(),
                };
                Some(quote! {
                    if let Some(v) = #value {
                        let v = i64::from(v);
                        if #cond_min || #cond_max {
                            return Err(ApiError::<#error_ty>::bad_request(
                                ErrorCode::INVALID_QUERY,
                                format!("query parameter `{}` must be {}, got {v}", #name, #bounds),
                            ).into());
                        }
                    }
                })
            });
            let checks = quote!(#(#checks)*);
            (
                quote! {
                    let query = input.query.into_inner();
                    #checks
                },
                checks,
            )
        };
        let unpack_headers =
            if header_params.is_empty() { quote!() } else { quote!(let headers = input.headers.into_inner();) };
        let unpack_body = if merge {
            quote!(let (body, fields) = input.body.into_parts();)
        } else if body_arg.is_some() {
            quote!(let body = input.body.into_inner();)
        } else {
            quote!()
        };
        let method_tok = format_ident!("{}", op.method);
        let route_path = format!("{base}{}", route.route_path);
        let tags = &o.tags;
        if tags.len() != 1 {
            bail!("{id}: exactly one tag per operation");
        }
        if let Some(key) = &shared_of[index] {
            // Served by the shared route's endpoint; documented at its own
            // path by `SharedRouteDocs`.
            let mut fields = Vec::new();
            for (var, spec_name) in &route.variables {
                let p = path_params.iter().find(|p| &p.name == spec_name).expect("checked above");
                if p.ty.to_string() != "String" {
                    bail!("{id}: a shared route's path variables must be strings ({{{spec_name}}} is not)");
                }
                let (to, from) = (field_ident(spec_name), field_ident(var));
                fields.push(quote!(#to: route.#from.clone()));
            }
            let build_path =
                if path_params.is_empty() { quote!() } else { quote!(let path = params::#path_ty { #(#fields),* };) };
            let build_query = if query_params.is_empty() {
                quote!()
            } else {
                quote! {
                    let query: params::#query_ty = crate::shared_query(&rqctx).await?;
                    #query_checks
                }
            };
            shared_members.entry(key.clone()).or_default().push(SharedMember {
                matches: literals_match(route, &quote!(route)),
                serve: quote! {
                    #build_path
                    #build_query
                    return match Self::#method_ident(rqctx, input.caller, #(#call_args),*).await {
                        Ok(value) => dropshot::HttpResponse::to_result(Reply::<#success_ty, #status_lit>(value)),
                        Err(error) => Err(error.into()),
                    };
                },
            });
            let spec_path = format!("{base}{}", op.spec_path);
            let doc_path_extractor =
                if path_params.is_empty() { quote!(Nothing) } else { quote!(dropshot::Path<params::#path_ty>) };
            doc_items.push(quote! {
                #doc_tokens
                #[endpoint { method = #method_tok, path = #spec_path, operation_id = #id, tags = [#(#tags),*] }]
                async fn #endpoint_ident(
                    rqctx: dropshot::RequestContext<Self::Context>,
                    input: Input<#doc_path_extractor, #query_extractor, Nothing>,
                ) -> Result<#reply_ty, dropshot::HttpError>;
            });
            continue;
        }
        trait_items.push(quote! {
            #doc_tokens
            #[endpoint { method = #method_tok, path = #route_path, operation_id = #id, tags = [#(#tags),*] }]
            async fn #endpoint_ident(
                rqctx: dropshot::RequestContext<Self::Context>,
                input: Input<#path_extractor, #query_extractor, #body_extractor #header_extractor>,
            ) -> Result<#reply_ty, dropshot::HttpError> {
                #unpack_path
                #unpack_query
                #unpack_headers
                #unpack_body
                match Self::#method_ident(rqctx, input.caller, #(#call_args),*).await {
                    Ok(value) => Ok(Reply(value)),
                    Err(error) => Err(error.into()),
                }
            }
        });
    }

    // One endpoint per shared route: the first operation whose literals
    // match answers; none is a 404 (or 405) like any unknown path, answered
    // by the route's `RouteLiterals` as the path is extracted (the endpoint's
    // own answer for it is never reached).
    for ((method, route_path), members) in shared_members {
        let name = format!("shared_{}_{}", method.to_lowercase(), route_path.to_snake_case());
        let endpoint_ident = format_ident!("{name}_endpoint");
        let route_ty = format_ident!("{}Route", name.to_upper_camel_case());
        let variables: Vec<&str> =
            route_path.split('/').filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}'))).collect();
        let route_params: Vec<Param> = variables
            .iter()
            .map(|v| Param {
                name: v.to_string(),
                required: true,
                description: None,
                ty: quote!(String),
                attrs: quote!(),
                range: None,
            })
            .collect();
        params.push(params_struct(
            &route_ty,
            &format!("The route variables of the shared route {method} {route_path}."),
            &route_params,
        ));
        let ops_doc = doc_attrs(&format!(
            "Serves every operation routed to {method} {route_path}, told apart by their literal segments \
             (unpublished: each is documented by `SharedRouteDocs`)."
        ));
        // The route's path is checked as it is extracted (`RoutePath`, before
        // the credential, the query and the body): a path none of the
        // members take is answered as dropshot's router answers it.
        let miss = no_route(&ops, method, &route_path, &quote!(route));
        params.push(route_literals(&route_ty, members.iter().map(|m| &m.matches), &miss));
        let arms = members.iter().map(|m| {
            let (matches, serve) = (&m.matches, &m.serve);
            quote!(if #matches { #serve })
        });
        let method_tok = format_ident!("{method}");
        let full_path = format!("{base}{route_path}");
        trait_items.push(quote! {
            #ops_doc
            #[endpoint { method = #method_tok, path = #full_path, operation_id = #name, unpublished = true }]
            async fn #endpoint_ident(
                rqctx: dropshot::RequestContext<Self::Context>,
                input: Input<RoutePath<params::#route_ty>, Nothing, Nothing>,
            ) -> Result<http::Response<dropshot::Body>, dropshot::HttpError> {
                let route = input.path.into_inner();
                #(#arms)*
                #miss
            }
        });
    }

    Ok(ServerItems {
        params: quote!(#(#params)*),
        trait_items: quote!(#(#trait_items)*),
        bridged: quote!(#(#bridged),*),
        doc_items: quote!(#(#doc_items)*),
    })
}
