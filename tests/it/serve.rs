//! `engine serve`'s session pool, in process (the wire protocol is tested from Python,
//! clients/python/tests): a reset naming the instance a pooled environment runs takes that
//! environment, an incremental reset, and still finds nothing of its last session; a session
//! whose own environment runs another instance trades it for the pooled one that runs it;
//! the old policy (`last`) does neither.

use crate::common;

use engine::serve::protocol::{parse_action, parse_reset};
use engine::serve::sessions::{Counts, PoolPolicy, Session, SessionConfig, Sessions};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

fn sessions(policy: PoolPolicy) -> Arc<Sessions> {
    let cfg = SessionConfig {
        max_sessions: 8,
        pool: 4,
        idle_timeout: Duration::from_secs(300),
        templates: std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("templates"),
        default_task: "archive-logs".into(),
        env: engine::env::EnvConfig::default(),
        pool_policy: policy,
    };
    Arc::new(Sessions::new(cfg, common::runtime(), common::cache()).unwrap())
}

async fn reset(all: &Arc<Sessions>, s: &Session, seed: u64) -> Value {
    let args = parse_reset(&json!({"task": "archive-logs", "seed": seed})).unwrap();
    all.reset(s, args).await.unwrap()
}

async fn step(all: &Arc<Sessions>, s: &Session, cmd: &str) -> String {
    let a = parse_action(&json!({"command": cmd})).unwrap();
    let data = all.step(s, a).await.unwrap();
    data["observation"]["stdout"].as_str().unwrap().to_string()
}

fn warm_cold(c: Counts) -> (u64, u64) {
    (c.warm_resets, c.cold_resets)
}

#[test]
fn the_pool_prefers_an_environment_that_runs_the_instance_and_it_keeps_nothing() {
    if !common::is_root() {
        eprintln!("skipped: needs root");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let all = sessions(PoolPolicy::Instance);
        // Two sessions on two instances each leave a secret file and a process behind.
        let a = all.open().unwrap();
        let b = all.open().unwrap();
        reset(&all, &a, 1).await;
        reset(&all, &b, 2).await;
        let instance_of = |s: &Arc<Session>| {
            let (all, s) = (all.clone(), s.clone());
            async move {
                all.state(&s).await["instance"]
                    .as_str()
                    .unwrap()
                    .to_string()
            }
        };
        let (one, two) = (instance_of(&a).await, instance_of(&b).await);
        assert_ne!(one, two);
        for s in [&a, &b] {
            step(
                &all,
                s,
                "echo top-secret > /root/secret; (sleep 1000 &) ; true",
            )
            .await;
        }
        all.close(&a).await;
        all.close(&b).await;
        let c = all.counts();
        assert_eq!((c.pooled_envs, warm_cold(c)), (2, (0, 2)));

        // A new session naming the first instance gets the environment that runs it (the
        // one returned first: the old policy would take the last), and nothing of `a`.
        let s = all.open().unwrap();
        let r = reset(&all, &s, 1).await;
        assert_eq!(r["observation"]["info"]["instance"], one.as_str());
        assert_eq!(warm_cold(all.counts()), (1, 2));
        assert_eq!(all.counts().pooled_envs, 1);
        let out = step(&all, &s, "cat /root/secret; pgrep -x sleep || echo none").await;
        assert!(!out.contains("top-secret") && out.contains("none"), "{out}");

        // Naming the second instance trades the session's environment for the pooled one
        // that runs it; its own goes back, and naming the first again takes it back.
        reset(&all, &s, 2).await;
        assert_eq!(instance_of(&s).await, two);
        assert_eq!(warm_cold(all.counts()), (2, 2));
        assert_eq!(all.counts().pooled_envs, 1);
        let out = step(&all, &s, "cat /root/secret; pgrep -x sleep || echo none").await;
        assert!(!out.contains("top-secret") && out.contains("none"), "{out}");
        step(
            &all,
            &s,
            "echo from-s > /root/secret2; (sleep 1000 &) ; true",
        )
        .await;
        reset(&all, &s, 1).await;
        assert_eq!(warm_cold(all.counts()), (3, 2));
        // The environment `s` gave up was wiped before it went back to the pool.
        let t = all.open().unwrap();
        reset(&all, &t, 2).await;
        assert_eq!(warm_cold(all.counts()), (4, 2));
        let out = step(&all, &t, "cat /root/secret2; pgrep -x sleep || echo none").await;
        assert!(!out.contains("from-s") && out.contains("none"), "{out}");

        // An instance nobody runs: the session's own environment starts it.
        reset(&all, &s, 3).await;
        assert_eq!(warm_cold(all.counts()), (4, 3));
        all.shutdown().await;
        assert_eq!(all.counts().pooled_envs, 0);

        // The old policy takes the environment returned last, whatever it runs.
        let all = sessions(PoolPolicy::Last);
        let (a, b) = (all.open().unwrap(), all.open().unwrap());
        reset(&all, &a, 1).await;
        reset(&all, &b, 2).await;
        all.close(&a).await;
        all.close(&b).await;
        let s = all.open().unwrap();
        reset(&all, &s, 1).await;
        assert_eq!(warm_cold(all.counts()), (0, 3));
        all.shutdown().await;
    });
}
