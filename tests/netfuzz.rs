#![allow(clippy::unwrap_used)]
//! Network faults (the fault proxy in the sandbox's network namespace) and tool-output
//! mutation (shims that mutate what a tool prints), observed from inside a sandbox.

mod common;

use engine::live::{synthesize, Live};
use engine::perturb::parse_spec;
use engine::synth::{Cache, Chosen, Plan};
use std::time::{Duration, Instant};

/// Proxy tests count the proxy's threads of this process: one at a time.
static PROXY_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn proxy_lock() -> std::sync::MutexGuard<'static, ()> {
    PROXY_TESTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// An instance of some perturbations, live in a sandbox (fields drop in order).
struct Env {
    live: Live,
    _cache: Cache,
    _state: common::TempState,
    _rt: sandbox::Runtime,
}

fn start(specs: &[&str], seed: u64) -> Env {
    let rt = common::runtime();
    let state = common::TempState::new();
    let cache = Cache::open(state.path()).unwrap();
    let chosen: Vec<Chosen> = specs.iter().map(|s| parse_spec(s).unwrap()).collect();
    let plan = Plan {
        task: None,
        ..Plan::for_task("none", seed, chosen)
    };
    let held = synthesize(&rt, &cache, &plan).unwrap();
    let live = Live::start(&rt, held).unwrap();
    Env {
        live,
        _cache: cache,
        _state: state,
        _rt: rt,
    }
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(env: &mut Env, cmd: &str) -> Out {
    let r = env.live.run(cmd, Duration::from_secs(30)).unwrap();
    Out {
        code: r.exit_code(),
        stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
    }
}

/// Threads of this process that belong to a fault proxy (named `proxy-...`).
fn proxy_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("proxy-"))
        })
        .count()
}

// ---------------------------------------------------------------------------------------------
// The fault proxy
// ---------------------------------------------------------------------------------------------

const UPSTREAM: u16 = 18080;

/// An HTTP/1.0 server on `UPSTREAM`: `GET /bytes/N` answers N bytes of `x`, anything else
/// `hello`. Sequential (one connection at a time), detached from the command.
const SERVER: &str = r#"
use IO::Socket::INET;
my $s = IO::Socket::INET->new(LocalAddr => '127.0.0.1', LocalPort => $ARGV[0], Listen => 64,
                              ReuseAddr => 1) or die "listen: $!";
$SIG{PIPE} = 'IGNORE';
while (my $c = $s->accept) {
    my $req = '';
    while (defined(my $l = <$c>)) { $req .= $l; last if $l =~ /^\r?\n$/; }
    my $body = $req =~ m{^GET /bytes/(\d+)} ? ('x' x $1) : 'hello';
    print $c "HTTP/1.0 200 OK\r\nContent-Length: " . length($body) . "\r\n\r\n" . $body;
    close $c;
}
"#;

/// A TCP client: connect to 127.0.0.1:ARGV[0], send ARGV[1] (if not empty), read until EOF,
/// an error or ARGV[2] seconds; print `EOF n`, `RESET n`, `TIMEOUT n`, `ERROR n errno` or
/// `REFUSED`.
const CLIENT: &str = r#"
use IO::Socket::INET;
use Errno;
$SIG{PIPE} = 'IGNORE';
my ($port, $send, $secs) = @ARGV;
$send =~ s/\\r\\n/\r\n/g;
my $c = IO::Socket::INET->new(PeerAddr => '127.0.0.1', PeerPort => $port, Timeout => 5)
    or do { print "REFUSED\n"; exit 0 };
syswrite($c, $send) if length $send;
my $got = 0;
my $end = eval {
    local $SIG{ALRM} = sub { die "alarm\n" };
    alarm $secs;
    while (1) {
        my $n = sysread($c, my $buf, 65536);
        if (!defined $n) { alarm 0; return $!{ECONNRESET} ? 'RESET' : 'ERROR'; }
        last if $n == 0;
        $got += $n;
    }
    alarm 0;
    'EOF';
};
$end = 'TIMEOUT' if !defined $end && $@ eq "alarm\n";
print "$end $got\n";
"#;

const GET: &str = "GET / HTTP/1.0\\r\\n\\r\\n";

/// Install the server and the client in /tmp, start the server, wait until it answers.
fn server_cmd() -> String {
    format!(
        "cat > /tmp/srv.pl <<'EOF'\n{SERVER}\nEOF\ncat > /tmp/cli.pl <<'EOF'\n{CLIENT}\nEOF\n\
         setsid perl /tmp/srv.pl {UPSTREAM} >/dev/null 2>&1 </dev/null &\n\
         for i in $(seq 100); do curl -s -m 2 http://127.0.0.1:{UPSTREAM}/ && exit 0; sleep 0.05; done; exit 1"
    )
}

fn start_server(env: &mut Env) {
    let o = run(env, &server_cmd());
    assert_eq!((o.code, o.stdout.as_str()), (0, "hello"), "{}", o.stderr);
}

/// Run the perl client: (outcome, bytes received).
fn client(env: &mut Env, port: u16, send: &str, secs: u32) -> (String, usize) {
    let o = run(env, &format!("perl /tmp/cli.pl {port} '{send}' {secs}"));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mut w = o.stdout.split_whitespace();
    let what = w.next().unwrap_or("").to_string();
    let n = w.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    (what, n)
}

fn curl_time(env: &mut Env, url: &str) -> f64 {
    let o = run(
        env,
        &format!("curl -s -o /dev/null -m 20 -w '%{{http_code}} %{{time_total}}' {url}"),
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let (code, t) = o.stdout.split_once(' ').unwrap();
    assert_eq!(code, "200");
    t.parse().unwrap()
}

#[test]
fn proxy_applies_each_toxic_and_stops_its_threads_when_dropped() {
    require_root!();
    let _l = proxy_lock();
    assert_eq!(proxy_threads(), 0);
    let up = UPSTREAM;
    let mut env = start(
        &[
            &format!("net-latency:port=8081,upstream={up},ms=300"),
            &format!("net-loss:port=8082,upstream={up},drop=1"),
            &format!("net-loss:port=8083,upstream={up},drop=0,stall=1"),
            &format!("net-reset:port=8084,upstream={up},probability=1"),
            &format!("net-reset:port=8085,upstream={up},probability=1,after_bytes=20"),
            &format!("net-bandwidth:port=8086,upstream={up},bps=20000"),
            &format!("net-timeout:port=8087,upstream={up},ms=700"),
        ],
        1,
    );
    start_server(&mut env);
    assert!(proxy_threads() >= 7, "one listener per proxy");

    // Latency: the answer comes through, at least 300 ms later (a lower bound only).
    let o = run(&mut env, "curl -s -m 10 http://127.0.0.1:8081/");
    assert_eq!(o.stdout, "hello");
    let direct = curl_time(&mut env, &format!("http://127.0.0.1:{up}/"));
    let slow = curl_time(&mut env, "http://127.0.0.1:8081/");
    assert!(slow >= 0.3, "latency {slow} s (direct {direct} s)");

    // Drop: accepted and closed at once, nothing received.
    assert_eq!(client(&mut env, 8082, "", 5), ("EOF".into(), 0));
    // Stall: accepted, never answered; the client times out.
    assert_eq!(client(&mut env, 8083, GET, 1), ("TIMEOUT".into(), 0));
    let o = run(&mut env, "curl -s -m 1 http://127.0.0.1:8083/; echo $?");
    assert_eq!(o.stdout.trim(), "28", "curl's timeout exit status");
    // Reset at the first data from the client: ECONNRESET.
    assert_eq!(client(&mut env, 8084, GET, 5), ("RESET".into(), 0));
    let o = run(&mut env, "curl -s -m 5 http://127.0.0.1:8084/; echo $?");
    assert_eq!(
        o.stdout.trim(),
        "56",
        "curl: recv failure (connection reset)"
    );
    // Reset after 20 bytes of the answer.
    let (what, n) = client(&mut env, 8085, "GET /bytes/5000 HTTP/1.0\\r\\n\\r\\n", 5);
    assert_eq!(what, "RESET");
    assert!(n <= 20, "{n} bytes before the reset");

    // Bandwidth: 30000 bytes at 20000 B/s take at least 1.5 s.
    let t = curl_time(&mut env, "http://127.0.0.1:8086/bytes/30000");
    assert!(t >= 1.5, "30000 bytes in {t} s at 20000 B/s");
    let o = run(
        &mut env,
        "curl -s -m 20 http://127.0.0.1:8086/bytes/30000 | wc -c",
    );
    assert_eq!(o.stdout.trim(), "30000", "every byte arrives");

    // Timeout: nothing gets through, closed after 700 ms.
    let t0 = Instant::now();
    assert_eq!(client(&mut env, 8087, GET, 10), ("EOF".into(), 0));
    assert!(t0.elapsed() >= Duration::from_millis(700));

    // A stalled connection is open while the Live is dropped: every thread still ends.
    run(
        &mut env,
        "setsid perl /tmp/cli.pl 8083 '' 60 >/dev/null 2>&1 </dev/null &",
    );
    let t0 = Instant::now();
    while proxy_threads() < 8 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(proxy_threads() >= 8, "the stalled connection has a thread");
    drop(env);
    assert_eq!(
        proxy_threads(),
        0,
        "proxy threads left after the Live was dropped"
    );
}

#[test]
fn proxy_choices_are_seeded_per_connection_and_restart_with_each_episode() {
    require_root!();
    let _l = proxy_lock();
    let pattern = |env: &mut Env| -> Vec<bool> {
        (0..16)
            .map(|_| client(env, 8090, GET, 5).1 > 0)
            .collect::<Vec<bool>>()
    };
    let spec = format!("net-loss:port=8090,upstream={UPSTREAM},drop=0.5");
    let mut env = start(&[&spec], 3);
    start_server(&mut env);
    let first = pattern(&mut env);
    assert!(first.contains(&true) && first.contains(&false), "{first:?}");
    // A new episode (reset: the server is gone, start it again) sees the same choices.
    env.live.restart().unwrap();
    start_server(&mut env);
    assert_eq!(pattern(&mut env), first);
    drop(env);
    // Another seed, other choices.
    let mut other = start(&[&spec], 4);
    start_server(&mut other);
    assert_ne!(pattern(&mut other), first);
}

#[test]
fn plain_forward_forwards_and_a_taken_port_is_an_error() {
    require_root!();
    let _l = proxy_lock();
    let rt = common::runtime();
    let mut sb = rt.create(&sandbox::SandboxConfig::default()).unwrap();
    let spec = engine::perturb::net::plain_forward(8095, 8096);
    let p = engine::perturb::net::start_proxy(sb.init_pid(), &spec).unwrap();
    let again = engine::perturb::net::start_proxy(sb.init_pid(), &spec);
    assert!(
        matches!(
            again,
            Err(engine::perturb::PerturbError::Proxy { port: 8095, .. })
        ),
        "a second proxy on a taken port must fail"
    );
    let r = sb
        .exec(&sandbox::ExecRequest::shell(format!(
            "({}\n) >/dev/null && curl -s -m 5 http://127.0.0.1:8095/",
            server_cmd().replace(&UPSTREAM.to_string(), "8096")
        )))
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "hello");
    assert!(p.connections() >= 1);
    drop(p);
    drop(sb);
    assert_eq!(proxy_threads(), 0);
}

#[test]
fn dns_broken_breaks_name_resolution_in_each_way() {
    require_root!();
    let mut env = start(&["dns-broken:how=wrong-hosts"], 5);
    let o = run(&mut env, "getent hosts localhost");
    let addr = o.stdout.split_whitespace().next().unwrap_or("").to_string();
    assert!(
        addr.starts_with("127.0.") && addr != "127.0.0.1",
        "{}",
        o.stdout
    );
    assert_eq!(
        run(&mut env, "grep -c '^127.0.0.1.*localhost' /etc/hosts")
            .stdout
            .trim(),
        "0"
    );
    // A service on 127.0.0.1 is not reached through the name (curl resolves `localhost`
    // itself, so a resolver user: perl).
    let o = run(
        &mut env,
        &format!(
            "({}\n) >/dev/null; for h in 127.0.0.1 localhost; do perl -MIO::Socket::INET -e \
             'print IO::Socket::INET->new(PeerAddr => $ARGV[0], PeerPort => {UPSTREAM}) ? \"up \" : \"down \"' $h; done",
            server_cmd()
        ),
    );
    assert_eq!(o.stdout.trim(), "up down", "{}", o.stderr);
    drop(env);

    let mut env = start(&["dns-broken:how=bad-nameserver"], 5);
    let o = run(&mut env, "cat /etc/resolv.conf");
    assert!(o.stdout.contains("nameserver 192.0.2."), "{}", o.stdout);
    drop(env);
    let mut env = start(&["dns-broken:how=garbage"], 5);
    let o = run(&mut env, "grep -Ec '^nameserver [0-9.]+$' /etc/resolv.conf");
    assert_eq!(o.stdout.trim(), "0", "no valid nameserver line");
    drop(env);
    let mut env = start(&["dns-broken:how=missing"], 5);
    assert_eq!(
        run(&mut env, "test -e /etc/resolv.conf; echo $?")
            .stdout
            .trim(),
        "1"
    );
}
