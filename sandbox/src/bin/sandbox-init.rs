//! PID 1 of every sandbox (see `sandbox::init`); the root package ships it as
//! `envfactory-init`.
fn main() {
    sandbox::init::main()
}
