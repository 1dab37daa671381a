#![allow(clippy::unwrap_used)]
use sandbox::*;
use std::time::Instant;
fn med(mut v: Vec<f64>) -> f64 { v.sort_by(f64::total_cmp); v[v.len()/2] }
fn main() {
    let c = sandbox::seccomp::SeccompPolicy::embedded().unwrap().compile().unwrap();
    println!("programs {:?}", c.programs.iter().map(|p| p.len()).collect::<Vec<_>>());
    let t = Instant::now(); for _ in 0..20 { match unsafe { nix::unistd::fork() }.unwrap() { nix::unistd::ForkResult::Child => { let p = c.prepare(); p.apply().unwrap(); unsafe { libc::_exit(0) } } nix::unistd::ForkResult::Parent{child} => { nix::sys::wait::waitpid(child, None).unwrap(); } } } println!("fork+apply {:.3} ms", t.elapsed().as_secs_f64()*1e3/20.0);
    let t = Instant::now(); for _ in 0..20 { match unsafe { nix::unistd::fork() }.unwrap() { nix::unistd::ForkResult::Child => { unsafe { libc::_exit(0) } } nix::unistd::ForkResult::Parent{child} => { nix::sys::wait::waitpid(child, None).unwrap(); } } } println!("fork only {:.3} ms", t.elapsed().as_secs_f64()*1e3/20.0);
    let init = InitProgram::at("target/release/envfactory-init".into(), vec![]).unwrap();
    let rt = Runtime::new(&state::default_state_dir(), init).unwrap();
    for (name, sec, ll, argv) in [("full", true, true, "sh"), ("abs", true, true, "/bin/sh"), ("noseccomp", false, true, "/bin/sh"), ("nolandlock", true, false, "/bin/sh"), ("none", false, false, "/bin/sh")] {
        let mut cfg = SandboxConfig::default();
        cfg.seccomp = sec; cfg.landlock = ll;
        let mut sb = rt.create(&cfg).unwrap();
        let req = ExecRequest::argv([argv, "-c", "true"]);
        let mut v = vec![]; let mut h = vec![];
        for _ in 0..100 {
            let t = Instant::now(); std::process::Command::new("sh").args(["-c","true"]).status().unwrap(); h.push(t.elapsed().as_secs_f64()*1e3);
            let t = Instant::now(); let r = sb.exec(&req).unwrap(); v.push(t.elapsed().as_secs_f64()*1e3);
            assert!(r.success());
        }
        let mut w = vec![];
        for _ in 0..100 { let t = Instant::now(); sb.health().unwrap(); w.push(t.elapsed().as_secs_f64()*1e3); }
        println!("{name:12} exec {:.3} host {:.3} ratio {:.2} health-rtt {:.3}", med(v.clone()), med(h.clone()), med(v)/med(h), med(w));
    }
}
#[allow(dead_code)]
fn lens() {}
