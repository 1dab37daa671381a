//! Network faults (the fault proxy in the sandbox's network namespace) and tool-output
//! mutation (shims that mutate what a tool prints), observed from inside a sandbox.

use crate::common;

use engine::instance::{PerturbationChoice, Plan};
use engine::perturb::parse_spec;
use engine::running::{synthesize, RunningInstance};
use engine::synth::Cache;
use std::time::{Duration, Instant};

/// Proxy tests count the proxy's threads of this process: one at a time.
static PROXY_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn proxy_lock() -> std::sync::MutexGuard<'static, ()> {
    PROXY_TESTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// An instance of some perturbations, live in a sandbox (fields drop in order).
struct Env {
    running: RunningInstance,
    _cache: Cache,
    _state: common::TempState,
    _rt: sandbox::Runtime,
}

fn start(specs: &[&str], seed: u64) -> Env {
    let rt = common::runtime();
    let state = common::TempState::new();
    let cache = Cache::open(state.path()).unwrap();
    let chosen: Vec<PerturbationChoice> = specs.iter().map(|s| parse_spec(s).unwrap()).collect();
    let plan = Plan {
        task: None,
        ..Plan::for_task("none", seed, chosen)
    };
    let held = synthesize(&rt, &cache, &plan).unwrap();
    let running = RunningInstance::start(&rt, held).unwrap();
    Env {
        running,
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
    let r = env.running.run(cmd, Duration::from_secs(30)).unwrap();
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
    // It counts the process's proxy threads: no other module's proxies may run meanwhile.
    if !common::isolated("netfuzz::proxy_applies_each_toxic_and_stops_its_threads_when_dropped") {
        return;
    }
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

    // A stalled connection is open while the RunningInstance is dropped: every thread still ends.
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
        "proxy threads left after the RunningInstance was dropped"
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
    env.running.restart().unwrap();
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
    // It counts the process's proxy threads: no other module's proxies may run meanwhile.
    if !common::isolated("netfuzz::plain_forward_forwards_and_a_taken_port_is_an_error") {
        return;
    }
    let _l = proxy_lock();
    let rt = common::runtime();
    let mut sb = rt.create(&sandbox::SandboxConfig::default()).unwrap();
    let spec = engine::instance::plain_forward(8095, 8096);
    let p = engine::netfault::start_proxy(sb.init_pid(), &spec).unwrap();
    let again = engine::netfault::start_proxy(sb.init_pid(), &spec);
    assert!(
        matches!(again, Err(ref e) if e.port() == 8095),
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

/// With a task, a network fault applies only to a front the task declared: on a task with no
/// network service it is "not applicable" (it would carry no traffic), on restore-service it
/// joins the task's front; certification then draws its combinations from the singles that
/// applied.
#[test]
fn network_faults_apply_only_to_a_task_front() {
    require_root!();
    let rt = common::runtime();
    let state = common::TempState::new();
    let cache = Cache::open(state.path()).unwrap();
    let net = parse_spec("net-reset:probability=0.5").unwrap();
    let e = synthesize(
        &rt,
        &cache,
        &Plan::for_task("archive-logs", 1, vec![net.clone()]),
    )
    .err()
    .unwrap();
    assert!(
        e.to_string().contains("not applicable") && e.to_string().contains("archive-logs"),
        "{e}"
    );
    let held = synthesize(
        &rt,
        &cache,
        &Plan::for_task("restore-service", 1, vec![net]),
    )
    .unwrap();
    let p = &held.instance.runtime.proxies;
    assert_eq!(p.len(), 1, "{p:?}");
    assert!((p[0].toxics.reset_probability - 0.5).abs() < 1e-9);
    drop(held);

    let singles: Vec<PerturbationChoice> = ["net-latency", "tool-missing:tool=gzip", "path-trim"]
        .iter()
        .map(|s| parse_spec(s).unwrap())
        .collect();
    let spec = engine::certify::CheckSpec {
        task: "archive-logs".into(),
        base: "host".into(),
        singles,
        combos: 3,
        seeds: vec![1],
        workers: 2,
    };
    let rows = engine::certify::check(&rt, &cache, &spec);
    assert_eq!(rows.len(), 1 + 3 + 3, "{rows:?}");
    assert_eq!(rows[1].status, "not-applicable", "{rows:?}");
    for r in &rows[4..] {
        assert!(
            !r.perturbations.contains("net-latency") && r.status != "not-applicable",
            "a combination drew an inapplicable single: {r:?}"
        );
    }
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

// ---------------------------------------------------------------------------------------------
// Tool-output mutation
// ---------------------------------------------------------------------------------------------

/// Files with fixed sizes and times, so every instance lists the same bytes.
const FIXTURE: &str = "mkdir -p /tmp/d/sub && head -c 123456 /dev/zero > /tmp/d/big && \
     echo hi > /tmp/d/small && for i in $(seq 1 40); do echo $i > /tmp/d/f$i.txt; done && \
     touch -h -d '2024-01-02 03:04:05' /tmp/d/* /tmp/d";

/// `cmd` under an output mutation (a fresh instance), and `plain` (the unshimmed tool, same
/// instance).
fn mutated(spec: &str, seed: u64, cmd: &str) -> Out {
    let mut env = start(&[spec], seed);
    assert_eq!(run(&mut env, FIXTURE).code, 0);
    run(&mut env, cmd)
}

fn plain(cmd: &str) -> Out {
    let mut env = start(&[], 1);
    assert_eq!(run(&mut env, FIXTURE).code, 0);
    run(&mut env, cmd)
}

/// The same seed prints the same bytes (in two instances); some other seed prints others.
fn assert_seeded(spec: &str, cmd: &str) {
    let a = mutated(spec, 1, cmd);
    let b = mutated(spec, 1, cmd);
    assert_eq!(
        (&a.stdout, &a.stderr),
        (&b.stdout, &b.stderr),
        "{spec}: same seed"
    );
    let differs = (2..12).any(|s| {
        let o = mutated(spec, s, cmd);
        (o.stdout, o.stderr) != (a.stdout.clone(), a.stderr.clone())
    });
    assert!(differs, "{spec}: no seed in 2..12 changes the output");
}

fn tokens(l: &str) -> Vec<String> {
    let mut t: Vec<String> = l.split_whitespace().map(str::to_string).collect();
    t.sort();
    t
}

#[test]
fn header_adds_banner_lines_and_keeps_status_effect_and_stdin() {
    require_root!();
    let spec = "output-mutation:tool=ls,mutation=header";
    let p = plain("ls -l /tmp/d");
    let m = mutated(spec, 1, "ls -l /tmp/d");
    assert_eq!(m.code, 0);
    assert!(m.stdout.ends_with(&p.stdout), "{}", m.stdout);
    let extra = m.stdout.lines().count() - p.stdout.lines().count();
    assert!((1..=3).contains(&extra), "{extra} banner lines");
    assert_seeded(spec, "ls -l /tmp/d");
    // Exit status and error output of the real tool.
    let e = mutated(spec, 1, "ls /nonexistent");
    assert_eq!(e.code, 2);
    assert!(
        e.stderr.contains("No such file or directory"),
        "{}",
        e.stderr
    );
    // The effect: tar still writes its archive while its listing is mutated.
    let t = mutated(
        "output-mutation:tool=tar,mutation=header,lines=2",
        1,
        "tar -cvf /tmp/a.tar -C /tmp/d big small && /usr/bin/tar -tf /tmp/a.tar",
    );
    assert_eq!(t.code, 0, "{}", t.stderr);
    let lines: Vec<&str> = t.stdout.lines().collect();
    assert_eq!(lines.len(), 2 + 2 + 2, "{}", t.stdout);
    assert_eq!(&lines[2..], ["big", "small", "big", "small"]);
    // Signals reach the tool: `timeout` ends the real `sleep`, and sees it die of SIGTERM.
    let t = mutated(
        "output-mutation:tool=sleep,mutation=header",
        1,
        "timeout -s TERM 1 sleep 30; echo \"rc=$?\"; /usr/bin/ps -eo args= | grep -cx 'sleep 30'",
    );
    assert!(t.stdout.ends_with("rc=124\n0\n"), "{}", t.stdout);
    // Output redirected into a file is the tool's own.
    let f = mutated(
        spec,
        1,
        "ls -l /tmp/d > /tmp/m && /usr/bin/ls -l /tmp/d > /tmp/p && cmp /tmp/m /tmp/p && echo same",
    );
    assert_eq!(f.stdout, "same\n", "{}", f.stderr);
    // Output piped into another program is data too: an archive streamed through a shimmed
    // `tar` into gzip stays valid, and `ls | cat` prints what `ls` prints.
    let z = mutated(
        "output-mutation:tool=tar,mutation=header,lines=2",
        1,
        "tar -cf - -C /tmp/d big small | gzip > /tmp/z.tgz && /usr/bin/tar -tzf /tmp/z.tgz",
    );
    assert_eq!(z.stdout, "big\nsmall\n", "{}", z.stderr);
    let p = mutated(
        spec,
        1,
        "ls -l /tmp/d | cat > /tmp/q; /usr/bin/ls -l /tmp/d | cmp - /tmp/q && echo same",
    );
    assert_eq!(p.stdout, "same\n", "{}", p.stderr);
    // stdin passes through.
    let c = mutated(
        "output-mutation:tool=cat,mutation=crlf",
        1,
        "printf 'a\\nb\\n' | cat",
    );
    assert_eq!(c.stdout, "a\r\nb\r\n");
}

#[test]
fn crlf_truncate_and_localized_numbers() {
    require_root!();
    let p = plain("ls -l /tmp/d");
    let m = mutated("output-mutation:tool=ls,mutation=crlf", 1, "ls -l /tmp/d");
    assert_eq!(m.stdout, p.stdout.replace('\n', "\r\n"));
    assert_seeded(
        "output-mutation:tool=ls,mutation=crlf,crlf_share=0.5",
        "ls -l /tmp/d",
    );

    let m = mutated(
        "output-mutation:tool=ls,mutation=truncate,keep_lines=3",
        1,
        "ls -l /tmp/d; echo \"rc=$?\" >&2",
    );
    let first3: String = p.stdout.lines().take(3).map(|l| format!("{l}\n")).collect();
    assert_eq!(m.stdout, first3);
    assert_eq!(m.stderr.trim(), "rc=0");
    assert_seeded("output-mutation:tool=ls,mutation=truncate", "ls -l /tmp/d");

    let m = mutated(
        "output-mutation:tool=ls,mutation=localized-numbers,style=de",
        1,
        "ls -l /tmp/d",
    );
    assert!(p.stdout.contains(" 123456 "));
    assert_eq!(m.stdout, p.stdout.replace(" 123456 ", " 123.456 "));
    let m = mutated(
        "output-mutation:tool=du,mutation=localized-numbers,style=fr",
        1,
        "du -b /tmp/d/big",
    );
    assert_eq!(m.stdout, "123\u{202f}456\t/tmp/d/big\n");
    assert_seeded(
        "output-mutation:tool=ls,mutation=localized-numbers",
        "ls -l /tmp/d",
    );
}

#[test]
fn stderr_interleave_moves_lines_and_delay_only_delays() {
    require_root!();
    let cmd = "ls -1 /tmp/d";
    let spec = "output-mutation:tool=ls,mutation=stderr-interleave,share=0.5";
    let p = plain(cmd);
    let m = mutated(spec, 1, cmd);
    let (out, err): (Vec<&str>, Vec<&str>) =
        (m.stdout.lines().collect(), m.stderr.lines().collect());
    assert!(!out.is_empty() && !err.is_empty(), "both streams get lines");
    let mut all: Vec<&str> = out.iter().chain(err.iter()).copied().collect();
    all.sort();
    let mut want: Vec<&str> = p.stdout.lines().collect();
    want.sort();
    assert_eq!(all, want, "every line is printed once, on one of the two");
    assert_seeded(spec, cmd);

    let t0 = Instant::now();
    let m = mutated(
        "output-mutation:tool=ls,mutation=delay,delay_ms=800",
        1,
        cmd,
    );
    assert!(t0.elapsed() >= Duration::from_millis(800));
    assert_eq!(m.stdout, p.stdout, "delay changes no byte");
}

#[test]
fn columns_reorder_and_rename_tables_consistently() {
    require_root!();
    let p = plain("ls -l /tmp/d");
    let spec = "output-mutation:tool=ls,mutation=columns";
    let m = mutated(spec, 1, "ls -l /tmp/d");
    let (pl, ml): (Vec<&str>, Vec<&str>) = (p.stdout.lines().collect(), m.stdout.lines().collect());
    assert_eq!(pl.len(), ml.len());
    assert_eq!(pl[0], ml[0], "the `total` line stays");
    for (a, b) in pl.iter().zip(&ml).skip(1) {
        assert_ne!(a, b);
        assert_eq!(tokens(a), tokens(b), "same fields, other order");
        assert_eq!(
            a.split_whitespace().last(),
            b.split_whitespace().last(),
            "name last"
        );
    }
    // Rows keep one column order: the date (the same in every row) is at one index.
    let idx: Vec<usize> = ml[1..]
        .iter()
        .map(|m| m.split_whitespace().position(|t| t == "Jan").unwrap())
        .collect();
    assert!(idx.windows(2).all(|w| w[0] == w[1]), "{idx:?}");
    assert_seeded(spec, "ls -l /tmp/d");

    let cmd = "df -k / /tmp";
    let pd = plain(cmd);
    let md = mutated(
        "output-mutation:tool=df,mutation=columns,columns=rename",
        1,
        cmd,
    );
    let (ph, mh) = (
        pd.stdout.lines().next().unwrap(),
        md.stdout.lines().next().unwrap(),
    );
    assert_ne!(ph, mh, "renamed header");
    assert_eq!(pd.stdout.lines().count(), md.stdout.lines().count());
    let md = mutated(
        "output-mutation:tool=ps,mutation=columns",
        1,
        "ps -o pid,ppid,args",
    );
    let head: Vec<&str> = md
        .stdout
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(head.len(), 3);
    assert_ne!(head, ["PID", "PPID", "COMMAND"], "{}", md.stdout);
    assert!(md.stdout.contains("ps -o pid,ppid,args"), "{}", md.stdout);
}

#[test]
fn status_line_mutates_curl_only() {
    require_root!();
    let cmd = format!(
        "({}\n) >/dev/null && curl -si http://127.0.0.1:{UPSTREAM}/ && echo && \
         curl -sv -o /dev/null http://127.0.0.1:{UPSTREAM}/ 2>&1 | grep '^< HTTP'",
        server_cmd()
    );
    let spec = "output-mutation:tool=curl,mutation=status-line";
    let m = mutated(spec, 1, &cmd);
    assert_eq!(m.code, 0, "{}", m.stderr);
    let lines: Vec<&str> = m.stdout.split('\n').collect();
    assert_ne!(lines[0], "HTTP/1.0 200 OK\r", "{}", m.stdout);
    assert!(lines[0].contains("200"), "the status code stays");
    assert!(
        m.stdout.contains("\r\n\r\nhello"),
        "the body stays: {}",
        m.stdout
    );
    let v = m.stdout.lines().last().unwrap();
    assert!(
        v.starts_with("< ") && v != "< HTTP/1.0 200 OK\r",
        "verbose too: {v}"
    );
    assert_seeded(spec, &cmd);
    // Tool-specific mutations refuse other tools at synthesis.
    let rt = common::runtime();
    let state = common::TempState::new();
    let cache = Cache::open(state.path()).unwrap();
    for s in [
        "output-mutation:tool=ls,mutation=status-line",
        "output-mutation:tool=curl,mutation=columns",
        "output-mutation:tool=no-such-tool,mutation=crlf",
        "output-mutation:tool=echo,mutation=crlf",
    ] {
        let plan = Plan {
            task: None,
            ..Plan::for_task("none", 1, vec![parse_spec(s).unwrap()])
        };
        let e = synthesize(&rt, &cache, &plan).err().unwrap();
        assert!(e.to_string().contains("not applicable"), "{s}: {e}");
    }
}
