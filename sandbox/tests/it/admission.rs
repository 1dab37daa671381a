//! Admission control: a runtime refuses a new sandbox past its cap or under its memory
//! reserve, with the reason, and takes new ones again once places are free.
use crate::common::*;
use sandbox::{Admission, SandboxError};

#[test]
fn a_cap_and_a_memory_reserve_refuse_new_sandboxes_with_the_reason() {
    require_root!();
    let rt = runtime();
    rt.set_admission(Admission {
        max_sandboxes: Some(2),
        memory_reserve_bytes: 0,
    });
    let a = rt.create(&config()).unwrap();
    let mut b = rt.create(&config()).unwrap();
    assert_eq!(rt.live_sandboxes(), 2);
    let e = rt.create(&config()).unwrap_err();
    assert!(matches!(e, SandboxError::Admission(_)), "{e}");
    assert_eq!(
        e.to_string(),
        "admission control refused a new sandbox: 2 sandboxes are alive, the cap (ENVFACTORY_MAX_SANDBOXES)"
    );
    assert_eq!(
        out(&sh(&mut b, "echo still")),
        "still\n",
        "the live ones go on"
    );
    drop(a);
    assert_eq!(rt.live_sandboxes(), 1);
    let c = rt.create(&config()).unwrap();
    // A failed creation gives its place back.
    let mut bad = config();
    bad.limits.cpus = 0.0001;
    drop(b);
    assert!(rt.create(&bad).is_err());
    assert_eq!(rt.live_sandboxes(), 1);
    drop(c);
    rt.set_admission(Admission {
        max_sandboxes: None,
        memory_reserve_bytes: u64::MAX,
    });
    let e = rt.create(&config()).unwrap_err().to_string();
    assert!(e.contains("memory available, under the reserve"), "{e}");
    assert_eq!(rt.live_sandboxes(), 0);
}
