//! PID 1 of every sandbox (see `sandbox::init`).
fn main() {
    sandbox::init::main()
}
