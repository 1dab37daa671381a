//! Network faults. This kernel has no netem, so faults come from a TCP proxy that the engine
//! runs inside the sandbox's network namespace (Toxiproxy's design, written from its
//! documentation): clients connect to the proxy's port, the proxy forwards to the real service
//! and applies the toxics.
//!
//! The port convention: a task's service listens on `upstream`; clients (the agent, the task's
//! instruction) use `port`. A network perturbation puts a faulty proxy on `port`; a task that
//! wants a front port without faults asks for [`plain_forward`](crate::instance::plain_forward). Several network
//! perturbations on the same `port` merge into one proxy. In an instance with a task, a
//! network perturbation applies only to a front the task declared (else it is not
//! applicable: the proxy would carry no traffic); without a task, to any port.
//!
//! The proxy itself is `netfault.rs`; these perturbations only declare it (a
//! [`ProxySpec`](crate::instance::ProxySpec) in the instance's runtime settings).

use super::{Info, Kind, ParamSpec, Params, ParamsExt, PerturbError, Perturbation};
use crate::instance::{plain_forward, Builder, Toxics};
use rand::{Rng, RngCore};

const PORT: ParamSpec = ParamSpec {
    name: "port",
    kind: Kind::Int { min: 1, max: 65535 },
    default: "8080",
    realistic: "the port clients use (the task's front port)",
    help: "port the proxy listens on (127.0.0.1 in the sandbox)",
};
const UPSTREAM: ParamSpec = ParamSpec {
    name: "upstream",
    kind: Kind::Int { min: 1, max: 65535 },
    default: "18080",
    realistic: "the port the real service listens on",
    help: "port the proxy forwards to (127.0.0.1 in the sandbox)",
};

/// Add a proxy for `port`, or merge into the one already there; `f` sets the toxics.
fn with_proxy(
    params: &Params,
    purpose: &str,
    b: &mut Builder,
    f: impl FnOnce(&mut Toxics),
) -> Result<String, PerturbError> {
    let port = params.int("port") as u16;
    let upstream = params.int("upstream") as u16;
    if port == upstream {
        return Err(PerturbError::BadParam {
            param: "upstream".into(),
            reason: format!("equals `port` ({port}): the proxy would forward to itself"),
        });
    }
    // With a task, a fault must land on traffic the task has: a front the task declared.
    // Anywhere else the proxy would carry nothing, and "solvable under net-latency" would
    // be a claim about a fault that never happened.
    if let Some(task) = &b.task {
        if !b.runtime.proxies.iter().any(|p| p.listen_port == port) {
            return Err(PerturbError::NotApplicable(format!(
                "the task `{}` has no service behind 127.0.0.1:{port}: a fault proxy there \
                 would carry no traffic",
                task.task
            )));
        }
    }
    let seed = b.rng(purpose).next_u64();
    let proxies = &mut b.runtime.proxies;
    let i = match proxies.iter().position(|p| p.listen_port == port) {
        Some(i) => {
            if proxies[i].upstream_port != upstream {
                return Err(PerturbError::BadParam {
                    param: "upstream".into(),
                    reason: format!(
                        "port {port} already forwards to {}, not {upstream}",
                        proxies[i].upstream_port
                    ),
                });
            }
            i
        }
        None => {
            let mut spec = plain_forward(port, upstream);
            spec.toxics.seed = seed;
            proxies.push(spec);
            proxies.len() - 1
        }
    };
    if proxies[i].toxics.seed == 0 {
        // A task's plain forward has no seed yet: the first fault gives it one.
        proxies[i].toxics.seed = seed;
    }
    f(&mut proxies[i].toxics);
    Ok(format!(
        "proxy 127.0.0.1:{port} -> {upstream}: {:?}",
        proxies[i].toxics
    ))
}

macro_rules! net_perturbation {
    ($ty:ident, $info:ident) => {
        pub struct $ty;
        impl Perturbation for $ty {
            fn info(&self) -> &'static Info {
                &$info
            }
            fn apply(
                &self,
                params: &Params,
                purpose: &str,
                b: &mut Builder,
            ) -> Result<String, PerturbError> {
                with_proxy(params, purpose, b, |t| Self::set(params, t))
            }
        }
    };
}

pub static NET_LATENCY: Info = Info {
    name: "net-latency",
    family: super::Family::Network,
    summary: "connections to a port are slow: every chunk is delayed",
    mechanism: "fault proxy on `port` forwarding to `upstream`; each chunk waits ms + \
                uniform(0..=jitter_ms) in each direction",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "ms",
            kind: Kind::Int {
                min: 0,
                max: 60_000,
            },
            default: "200",
            realistic: "20-500 (WAN, congested links), up to 3000 (satellite, overloaded)",
            help: "delay added to every chunk in each direction",
        },
        ParamSpec {
            name: "jitter_ms",
            kind: Kind::Int {
                min: 0,
                max: 60_000,
            },
            default: "0",
            realistic: "0-100",
            help: "uniform extra delay per chunk",
        },
    ],
};
net_perturbation!(NetLatency, NET_LATENCY);
impl NetLatency {
    fn set(p: &Params, t: &mut Toxics) {
        t.latency_ms = p.int("ms") as u64;
        t.jitter_ms = p.int("jitter_ms") as u64;
    }
}

pub static NET_LOSS: Info = Info {
    name: "net-loss",
    family: super::Family::Network,
    summary: "some connections are closed at once, others hang without an answer",
    mechanism: "fault proxy; per connection (seeded by the connection number): closed at \
                accept with probability `drop`, else accepted and never answered with \
                probability `stall`",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "drop",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0.3",
            realistic: "0.01-0.5 (flaky links, overloaded load balancers)",
            help: "probability that a connection is closed at accept",
        },
        ParamSpec {
            name: "stall",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0",
            realistic: "0-0.3 (black-holed packets, full backlogs)",
            help: "probability that a connection is accepted and never answered",
        },
    ],
};
net_perturbation!(NetLoss, NET_LOSS);
impl NetLoss {
    fn set(p: &Params, t: &mut Toxics) {
        t.drop_probability = p.float("drop");
        t.stall_probability = p.float("stall");
    }
}

pub static NET_BANDWIDTH: Info = Info {
    name: "net-bandwidth",
    family: super::Family::Network,
    summary: "transfers through a port are slow",
    mechanism: "fault proxy; each direction forwards in chunks of bps/20 bytes and never \
                runs ahead of bps bytes per second",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "bps",
            kind: Kind::Int {
                min: 1,
                max: 1 << 40,
            },
            default: "65536",
            realistic: "8000-1000000 (modems, throttled links, shared uplinks)",
            help: "bytes per second in each direction",
        },
    ],
};
net_perturbation!(NetBandwidth, NET_BANDWIDTH);
impl NetBandwidth {
    fn set(p: &Params, t: &mut Toxics) {
        t.bandwidth_bps = p.int("bps") as u64;
    }
}

pub static NET_RESET: Info = Info {
    name: "net-reset",
    family: super::Family::Network,
    summary: "some connections are reset (ECONNRESET) after some bytes",
    mechanism: "fault proxy; a connection chosen with `probability` (seeded) is closed with \
                SO_LINGER 0 (a TCP RST) once `after_bytes` went to the client, or at the \
                client's first data when 0",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "probability",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0.5",
            realistic: "0.01-0.5 (restarting peers, middleboxes, idle timeouts)",
            help: "probability that a connection is reset",
        },
        ParamSpec {
            name: "after_bytes",
            kind: Kind::Int {
                min: 0,
                max: 1 << 40,
            },
            default: "0",
            realistic: "0 (at once) to a few KiB (mid-response)",
            help: "bytes forwarded to the client before the reset",
        },
    ],
};
net_perturbation!(NetReset, NET_RESET);
impl NetReset {
    fn set(p: &Params, t: &mut Toxics) {
        t.reset_probability = p.float("probability");
        t.reset_after_bytes = p.int("after_bytes") as u64;
    }
}

pub static NET_TIMEOUT: Info = Info {
    name: "net-timeout",
    family: super::Family::Network,
    summary: "connections are accepted, nothing gets through, and they close after a timeout",
    mechanism: "fault proxy (Toxiproxy's timeout toxic): the proxy connects upstream but \
                forwards nothing and closes both sides `ms` after accept",
    params: &[
        PORT,
        UPSTREAM,
        ParamSpec {
            name: "ms",
            kind: Kind::Int {
                min: 1,
                max: 600_000,
            },
            default: "1000",
            realistic: "1000-60000 (gateway and load-balancer timeouts)",
            help: "time after which the proxy closes each connection",
        },
    ],
};
net_perturbation!(NetTimeout, NET_TIMEOUT);
impl NetTimeout {
    fn set(p: &Params, t: &mut Toxics) {
        t.timeout_ms = p.int("ms") as u64;
    }
}

pub static DNS_BROKEN: Info = Info {
    name: "dns-broken",
    family: super::Family::Network,
    summary: "name resolution is misconfigured",
    mechanism: "writes the layer's /etc/resolv.conf (an unreachable nameserver, or garbage), \
                deletes it, or rewrites /etc/hosts so `name` maps to a wrong loopback address",
    params: &[
        ParamSpec {
            name: "how",
            kind: Kind::Choice(&["bad-nameserver", "garbage", "missing", "wrong-hosts"]),
            default: "wrong-hosts",
            realistic: "all four happen (stale DHCP, broken templating, hand edits)",
            help: "what is broken",
        },
        ParamSpec {
            name: "name",
            kind: Kind::Str,
            default: "localhost",
            realistic: "localhost or a service name the task uses",
            help: "host name that `wrong-hosts` maps to a wrong address",
        },
    ],
};

pub struct DnsBroken;

const GARBAGE: &[&str] = &[
    "nameserver\n",
    "nameserver 256.1.1.1\n",
    "namesever 127.0.0.53\n",
    "nameserver 127.0.0.53 127.0.0.1\noptions ndots:abc\n",
    "<<<<<<< HEAD\nnameserver 10.0.0.2\n=======\n>>>>>>> dhcp\n",
    "search\x00corp\nnameserver: 8.8.8.8\n",
];

impl Perturbation for DnsBroken {
    fn info(&self) -> &'static Info {
        &DNS_BROKEN
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let mut rng = b.rng(purpose);
        match params.str("how") {
            "bad-nameserver" => {
                // TEST-NET addresses (RFC 5737): never answer.
                let ns = format!("192.0.2.{}", rng.gen_range(1..=254));
                b.remove("/etc/resolv.conf")?;
                b.write(
                    "/etc/resolv.conf",
                    format!("# generated by NetworkManager\nnameserver {ns}\noptions timeout:2 attempts:1\n"),
                    0o644,
                )?;
                Ok(format!("/etc/resolv.conf points at {ns}"))
            }
            "garbage" => {
                let g = GARBAGE[rng.gen_range(0..GARBAGE.len())];
                b.remove("/etc/resolv.conf")?;
                b.write("/etc/resolv.conf", g, 0o644)?;
                Ok("/etc/resolv.conf is garbage".into())
            }
            "missing" => {
                if !b.exists("/etc/resolv.conf") {
                    return Err(PerturbError::NotApplicable(
                        "the base has no /etc/resolv.conf".into(),
                    ));
                }
                b.remove("/etc/resolv.conf")?;
                Ok("/etc/resolv.conf removed".into())
            }
            _ => {
                let name = params.str("name").trim();
                if name.is_empty() || name.contains(char::is_whitespace) {
                    return Err(PerturbError::BadParam {
                        param: "name".into(),
                        reason: format!("`{name}` is not a host name"),
                    });
                }
                // Another loopback address: on `lo`, but nothing listens there.
                let wrong = format!(
                    "127.0.{}.{}",
                    rng.gen_range(1..=254),
                    rng.gen_range(2..=254)
                );
                let old = b
                    .read("/etc/hosts")
                    .map(|d| String::from_utf8_lossy(&d).into_owned())
                    .unwrap_or_default();
                let mut out = String::new();
                for line in old.lines() {
                    let body = line.split('#').next().unwrap_or("");
                    let mut f = body.split_whitespace();
                    let addr = f.next();
                    let names: Vec<&str> = f.collect();
                    if addr.is_some() && names.contains(&name) {
                        let rest: Vec<&str> = names.into_iter().filter(|n| *n != name).collect();
                        if !rest.is_empty() {
                            out.push_str(&format!("{}\t{}\n", addr.unwrap_or(""), rest.join(" ")));
                        }
                        continue;
                    }
                    out.push_str(line);
                    out.push('\n');
                }
                out.push_str(&format!("{wrong}\t{name}\n"));
                b.remove("/etc/hosts")?;
                b.write("/etc/hosts", out, 0o644)?;
                Ok(format!("/etc/hosts maps {name} to {wrong}"))
            }
        }
    }
}

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![
        &NetLatency,
        &NetLoss,
        &NetBandwidth,
        &NetReset,
        &NetTimeout,
        &DnsBroken,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::{BaseView, Resources, FRONT_PORT, SERVICE_PORT};

    fn apply(b: &mut Builder, spec: &str, i: usize) -> Result<String, PerturbError> {
        let c = super::super::parse_spec(spec)?;
        let p = super::super::get(&c.name).ok_or(PerturbError::Unknown(c.name.clone()))?;
        p.apply(&c.params, &format!("{}#{i}", c.name), b)
    }

    #[test]
    fn perturbations_on_one_port_merge_into_one_proxy() {
        let base = BaseView::from_dirs(vec![]);
        let mut b = Builder::new(&base, 1, Resources::default());
        apply(
            &mut b,
            "net-latency:port=80,upstream=8080,ms=100,jitter_ms=5",
            0,
        )
        .unwrap();
        apply(&mut b, "net-loss:port=80,upstream=8080,drop=0.25", 1).unwrap();
        apply(&mut b, "net-reset:port=81,upstream=8080,probability=0.5", 2).unwrap();
        let p = b.runtime.proxies.clone();
        assert_eq!(p.len(), 2);
        let t = &p[0].toxics;
        assert_eq!(
            (t.latency_ms, t.jitter_ms, t.drop_probability),
            (100, 5, 0.25)
        );
        assert_ne!(t.seed, p[1].toxics.seed);
        assert!(matches!(
            apply(&mut b, "net-loss:port=80,upstream=9090", 3),
            Err(PerturbError::BadParam { .. })
        ));
        assert!(matches!(
            apply(&mut b, "net-loss:port=80,upstream=80", 4),
            Err(PerturbError::BadParam { .. })
        ));
        // A task's plain forward takes the first fault's seed.
        let mut fwd = Builder::new(&base, 1, Resources::default());
        fwd.runtime
            .proxies
            .push(plain_forward(FRONT_PORT, SERVICE_PORT));
        apply(&mut fwd, "net-loss", 0).unwrap();
        assert_eq!(fwd.runtime.proxies.len(), 1);
        let want = fwd.rng("net-loss#0").next_u64();
        assert_eq!(fwd.runtime.proxies[0].toxics.seed, want);
        assert_ne!(want, 0);
        assert_eq!(PORT.default, FRONT_PORT.to_string());
        assert_eq!(UPSTREAM.default, SERVICE_PORT.to_string());
        // The same plan gives the same seeds.
        let mut again = Builder::new(&base, 1, Resources::default());
        apply(
            &mut again,
            "net-latency:port=80,upstream=8080,ms=100,jitter_ms=5",
            0,
        )
        .unwrap();
        assert_eq!(again.runtime.proxies[0].toxics.seed, t.seed);
    }

    #[test]
    fn wrong_hosts_remaps_only_the_name() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("etc")).unwrap();
        std::fs::write(
            dir.path().join("etc/hosts"),
            "127.0.0.1 localhost box\n::1 localhost ip6-localhost\n10.0.0.5 db # the db\n",
        )
        .unwrap();
        let base = BaseView::from_dirs(vec![dir.path().to_path_buf()]);
        let mut b = Builder::new(&base, 1, Resources::default());
        apply(&mut b, "dns-broken:how=wrong-hosts", 0).unwrap();
        let hosts = String::from_utf8(b.read("/etc/hosts").unwrap()).unwrap();
        let lines: Vec<&str> = hosts.lines().collect();
        assert_eq!(lines[0], "127.0.0.1\tbox");
        assert_eq!(lines[1], "::1\tip6-localhost");
        assert_eq!(lines[2], "10.0.0.5 db # the db");
        assert!(lines[3].starts_with("127.0.") && lines[3].ends_with("\tlocalhost"));
        assert_eq!(lines.len(), 4);
    }
}
