//! `envfactory-init`: PID 1 of every sandbox, built beside the `engine` binary.
fn main() {
    sandbox::init::main()
}
