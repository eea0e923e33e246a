//! Prints the SandboxRun CRD as YAML:
//! `cargo run -p sandboxrun-api --bin crdgen > crds/sandboxrun.dev_sandboxruns.yaml`
//! (and copy it to `charts/sandboxrun/crds/`; the `crd_is_up_to_date` test checks both).

fn main() {
    print!("{}", sandboxrun_api::crd_yaml());
}
