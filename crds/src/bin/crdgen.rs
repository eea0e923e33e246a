//! Prints a CRD as YAML: `cargo run -p sandboxrun-api --bin crdgen > crds/sandboxrun.dev_sandboxruns.yaml`
//! , `cargo run -p sandboxrun-api --bin crdgen -- pool > crds/sandboxrun.dev_sandboxpools.yaml`
//! and `cargo run -p sandboxrun-api --bin crdgen -- session > crds/sandboxrun.dev_sandboxsessions.yaml`
//! (and copy them to `charts/sandboxrun/crds/`; the `crd_is_up_to_date` test checks all six).

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("pool") => print!("{}", sandboxrun_api::pool_crd_yaml()),
        Some("session") => print!("{}", sandboxrun_api::session_crd_yaml()),
        _ => print!("{}", sandboxrun_api::crd_yaml()),
    }
}
