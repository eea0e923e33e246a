//! The MCP resources agents read, judged per caller like the tools:
//!
//! - `sandboxrun://databases/{database}/schema` (with `--enable-sql`): what the caller's queries
//!   may read in a database, the tables and columns with their types, as JSON. A read is an sql
//!   call of its own ([`SqlSchema`], `core/src/tools/sql_schema.rs`), on the same backend as
//!   `execute_sql`: the operator decides, reads and audits it in a cluster; embedded, this
//!   process does. The access token's scopes and the API key's environments bind it as they bind
//!   `execute_sql`.
//! - `sandboxrun://runs/{run}/files/{name}`: a file a `run_python` run returned, readable by the
//!   agent that made the run for as long as the run is kept (a cluster: the SandboxRun's status,
//!   until its TTL; embedded: `run_files.rs`). Another agent's run, an unknown run or file: not
//!   found, the same answer, so a name reveals nothing.
//!
//! `resources/list` names the schemas the caller may read (embedded, where this process holds the
//! policy; a cluster's operator does, so there the template is the way in) and the caller's kept
//! run files; `resources/templates/list` names both templates.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use rmcp::model::{
    CacheScope, ListResourceTemplatesResult, ListResourcesResult, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ResourceTemplate, ResultType,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use sandboxrun_core::tools::Attachment;
use sandboxrun_core::tools::sql_schema::{self, SqlSchema};
use sandboxrun_core::{Phase, Tool, files};

use crate::backend::Backend;
use crate::server::{SandboxRunServer, resource_not_found};

/// The schema resource's URI template.
pub const SCHEMA_TEMPLATE: &str = "sandboxrun://databases/{database}/schema";
/// The run file resource's URI template.
pub const FILE_TEMPLATE: &str = "sandboxrun://runs/{run}/files/{name}";
const SCHEME: &str = "sandboxrun://";
const JSON: &str = "application/json";

/// What a `sandboxrun://` URI names.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    Schema { database: &'a str },
    File { run: &'a str, name: &'a str },
}

/// The resource `uri` names, when it is one of ours, well formed: database and run names of
/// letters, digits, `.`, `_` and `-`; a file name as a run may return one
/// ([`files::check_name`]). Nothing is decoded, so no `..` or `%2F` can reach further.
fn target(uri: &str) -> Option<Target<'_>> {
    let plain = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            && !s.starts_with('.')
    };
    let parts: Vec<&str> = uri.strip_prefix(SCHEME)?.split('/').collect();
    match parts.as_slice() {
        ["databases", database, "schema"] if plain(database) => Some(Target::Schema { database }),
        ["runs", run, "files", name] if plain(run) && files::check_name(name).is_ok() => {
            Some(Target::File { run, name })
        }
        _ => None,
    }
}

fn schema_uri(database: &str) -> String {
    format!("{SCHEME}databases/{database}/schema")
}

fn file_uri(run: &str, name: &str) -> String {
    format!("{SCHEME}runs/{run}/files/{name}")
}

/// The content of a returned file: text as text, with an inert type; anything else as a blob.
fn file_contents(uri: String, file: Attachment) -> Option<ResourceContents> {
    Some(match file {
        Attachment::Text {
            mime_type, text, ..
        } => ResourceContents::text(text, uri).with_mime_type(files::inert_text_type(&mime_type)),
        Attachment::Image {
            mime_type, data, ..
        } => ResourceContents::blob(BASE64.encode(data), uri).with_mime_type(mime_type),
        Attachment::Binary { data, .. } => ResourceContents::blob(BASE64.encode(data), uri)
            .with_mime_type("application/octet-stream"),
        Attachment::Note(_) => return None,
    })
}

impl SandboxRunServer {
    /// Whether the caller may read schemas at all: `execute_sql` is offered, its token grants
    /// it, and its key allows the environment a schema read names (sandbox; policy binds the
    /// database's own). The refusal names what is missing.
    fn schema_refusal(&self, context: &RequestContext<RoleServer>) -> Option<String> {
        if !self.shared.sql {
            return Some("this server does not offer execute_sql (--enable-sql)".to_owned());
        }
        let agent = self.caller(context);
        if let Some(message) = self
            .grant(context)
            .and_then(|g| g.tool_refusal(&agent, Tool::Sql))
        {
            return Some(message);
        }
        let environment = sql_schema::ENVIRONMENT;
        if let Some(message) = self
            .grant(context)
            .and_then(|g| g.environment_refusal(&agent, environment))
        {
            return Some(message);
        }
        match self.shared.environments.get(&agent) {
            Some(allowed) if !allowed.contains(&environment) => Some(format!(
                "agent {agent} may not target the {environment} environment a schema read names"
            )),
            _ => None,
        }
    }

    /// `resources/list`: the schemas the caller may read (embedded) and its kept run files.
    pub(crate) async fn list_resources_for(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> ListResourcesResult {
        let agent = self.caller(context);
        let mut resources = Vec::new();
        if let Backend::Local(local) = &self.shared.backend {
            let embedded = local.embedded();
            if self.schema_refusal(context).is_none()
                && let Some(databases) = embedded.databases.as_ref()
            {
                for database in databases.names() {
                    let call = sql_schema::call_context(databases, &agent, &database);
                    if embedded.policy.evaluate(&call).schema.is_some() {
                        resources.push(
                            Resource::new(schema_uri(&database), format!("{database} schema"))
                                .with_title(format!("What your queries may read in {database}"))
                                .with_description(
                                    "The tables and columns execute_sql may read in this \
                                     database under your policy, with their types",
                                )
                                .with_mime_type(JSON),
                        );
                    }
                }
            }
            for (run, name) in self.shared.run_files.list(&agent) {
                resources.push(
                    Resource::new(file_uri(&run, &name), name.clone())
                        .with_description(format!("A file run {run} returned")),
                );
            }
        }
        let hints = crate::revision::stateless(context);
        ListResourcesResult {
            result_type: Some(ResultType::COMPLETE),
            resources,
            meta: None,
            next_cursor: None,
            ttl_ms: hints.then_some(0),
            cache_scope: hints.then_some(CacheScope::Private),
        }
    }

    /// `resources/templates/list`: the schema template (with `--enable-sql`) and the run file
    /// template; the same for every caller.
    pub(crate) fn resource_templates(&self) -> ListResourceTemplatesResult {
        let mut templates = Vec::new();
        if self.shared.sql {
            templates.push(
                ResourceTemplate::new(SCHEMA_TEMPLATE, "database schema")
                    .with_title("What your queries may read in a database")
                    .with_description(
                        "The tables and columns execute_sql may read in {database} under your \
                         policy, with their types: read it before writing a query",
                    )
                    .with_mime_type(JSON),
            );
        }
        templates.push(
            ResourceTemplate::new(FILE_TEMPLATE, "run file")
                .with_title("A file a run returned")
                .with_description(
                    "A file your run_python run {run} wrote to /tmp/outputs, named {name}, for \
                     as long as the run is kept",
                ),
        );
        ListResourceTemplatesResult {
            resource_templates: templates,
            ..Default::default()
        }
    }

    /// `resources/read` of a `sandboxrun://` URI.
    pub(crate) async fn read_resource_for(
        &self,
        uri: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let contents = match target(uri) {
            Some(Target::Schema { database }) => self.read_schema(uri, database, context).await?,
            Some(Target::File { run, name }) => self.read_file(uri, run, name, context).await?,
            None => return Err(resource_not_found(uri)),
        };
        Ok(ReadResourceResult::new(vec![contents]).into())
    }

    async fn read_schema(
        &self,
        uri: &str,
        database: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<ResourceContents, ErrorData> {
        if let Some(why) = self.schema_refusal(context) {
            return Err(not_readable(uri, &why));
        }
        let agent = self.caller(context);
        // A read is a run like a call's: it takes one of the agent's in-flight places.
        let Some(_slot) = self.shared.in_flight.acquire(&agent) else {
            return Err(ErrorData::invalid_request(
                format!(
                    "agent {agent} already has {} calls in flight, the most this server allows \
                     at a time: wait for one of them to finish, then read {uri} again",
                    self.shared.in_flight.max()
                ),
                None,
            ));
        };
        let call = sql_schema::SchemaArgs {
            database: database.to_owned(),
        };
        let output = self
            .shared
            .backend
            .call::<SqlSchema>(
                &agent,
                call,
                Arc::new(|_, _, _| {}),
                None,
                context.ct.child_token(),
                Some(std::time::Duration::ZERO),
            )
            .await
            .map_err(|e| {
                ErrorData::internal_error(
                    format!("the schema of {database} could not be read: {e}"),
                    None,
                )
            })?;
        if output.phase != Phase::Succeeded {
            let why = output
                .error_text()
                .unwrap_or_else(|| format!("the read ended {}", output.phase));
            return Err(not_readable(uri, &why));
        }
        let text = serde_json::to_string_pretty(&output).unwrap_or_default();
        Ok(ResourceContents::text(text, uri).with_mime_type(JSON))
    }

    async fn read_file(
        &self,
        uri: &str,
        run: &str,
        name: &str,
        context: &RequestContext<RoleServer>,
    ) -> Result<ResourceContents, ErrorData> {
        let agent = self.caller(context);
        let file = match &self.shared.backend {
            Backend::Local(_) => self.shared.run_files.get(&agent, run, name),
            Backend::Kube(kube) => kube
                .run_files(&agent, run, context.ct.clone())
                .await
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?
                .and_then(|files| files.into_iter().find(|f| f.name == name))
                .map(|f| Attachment::of(&f)),
        };
        file.and_then(|f| file_contents(uri.to_owned(), f))
            .ok_or_else(|| resource_not_found(uri))
    }
}

/// The error of a resource the caller may not read, saying why (policy's words).
fn not_readable(uri: &str, why: &str) -> ErrorData {
    ErrorData::resource_not_found(
        format!("{uri} cannot be read: {why}"),
        Some(serde_json::json!({ "uri": uri })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_well_formed_uris_name_a_resource() {
        assert_eq!(
            target("sandboxrun://databases/demo/schema"),
            Some(Target::Schema { database: "demo" })
        );
        assert_eq!(
            target("sandboxrun://runs/run-abc12/files/chart.png"),
            Some(Target::File {
                run: "run-abc12",
                name: "chart.png"
            })
        );
        for uri in [
            "sandboxrun://databases//schema",
            "sandboxrun://databases/../schema",
            "sandboxrun://databases/a%2Fb/schema",
            "sandboxrun://databases/demo/schema/",
            "sandboxrun://databases/demo",
            "sandboxrun://runs/run-1/files/../../etc/passwd",
            "sandboxrun://runs/run-1/files/..",
            "sandboxrun://runs/run-1/files/.hidden",
            "sandboxrun://runs/run-1/files/a%2Fb",
            "sandboxrun://runs/run-1/files/",
            "sandboxrun://runs/../files/x",
            "sandboxrun://runs/run-1/files/x/y",
            "file:///tmp/outputs/chart.png",
            "sandboxrun:/databases/demo/schema",
        ] {
            assert_eq!(target(uri), None, "{uri}");
        }
    }
}
