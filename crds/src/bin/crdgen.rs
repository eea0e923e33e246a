//! Prints a CRD as YAML: `cargo run -p sandboxrun-api --bin crdgen > crds/sandboxrun.dev_sandboxruns.yaml`
//! and `cargo run -p sandboxrun-api --bin crdgen -- pool > crds/sandboxrun.dev_sandboxpools.yaml`
//! (and copy both to `charts/sandboxrun/crds/`; the `crd_is_up_to_date` test checks all four).

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("pool") => print!("{}", sandboxrun_api::pool_crd_yaml()),
        _ => print!("{}", sandboxrun_api::crd_yaml()),
    }
}
