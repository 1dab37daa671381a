//! `envfactory-init`: PID 1 of every sandbox, built beside the engine program (`engine-core`).
fn main() {
    sandbox::init::main()
}
