//! Which protocol revision a request speaks, where the answer differs: the stateless 2026-07-28
//! revision carries its protocol version, capabilities and log level in each request's `_meta`,
//! knows caching hints, and has no session (nor `logging/setLevel`, nor `ping`).

use rmcp::RoleServer;
use rmcp::model::ProtocolVersion;
use rmcp::service::RequestContext;

/// Whether `ctx` is a request of the stateless revision (2026-07-28 and later).
pub fn stateless(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.protocol_version()
        .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28)
}
