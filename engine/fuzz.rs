//! Tool-output mutation: fuzzing the observation channel. The `output-mutation` perturbation
//! puts a shim for a tool first on the default `PATH` (`/usr/local/bin/<tool>`): a perl script
//! (perl-base only) that runs the real tool by its absolute path with the same arguments,
//! stdin, environment and working directory, pipes what it prints through a mutator with the
//! seed and the mutation baked in, and exits with the real tool's status (or dies of its
//! signal). What the tool does to the system is unchanged; only what it prints is.
//!
//! Mutations: `header` (banner and warning lines first), `status-line` (curl/wget: a malformed
//! HTTP status line), `delay` (a pause before the output and inside some lines), `columns`
//! (ls -l, df, ps: columns reordered and/or renamed, header and rows consistently), `crlf`,
//! `stderr-interleave` (some stdout lines go to stderr), `truncate` (only the first lines),
//! `localized-numbers` (decimal commas, thousands separators). Every choice comes from the
//! seed and the output itself, so the same command prints the same mutated bytes every time.
//! Only output bound for the observation channel is mutated: the shim mutates when its stdout
//! is the command's own stdout (the pipe the sandbox reads, as the session leader holds it);
//! output into a file, into another program (`tool | gzip`) or into `$(...)` is data, and the
//! shim runs the tool unchanged. Shell builtins (`echo`, `printf`, `test`, ...) cannot be shimmed.

use crate::perturb::{
    Family, Info, Kind, ParamSpec, Params, ParamsExt, PerturbError, Perturbation,
};
use crate::synth::{Builder, DEFAULT_PATH};
use rand::RngCore;

#[derive(Debug, thiserror::Error)]
pub enum FuzzError {
    #[error("`{0}` is not a tool name (letters, digits, `._+-`)")]
    BadTool(String),
    #[error("the base has no tool `{0}` on the default PATH")]
    NoTool(String),
    #[error("mutation `{mutation}` is for {tools}, not `{tool}`")]
    WrongTool {
        mutation: String,
        tool: String,
        tools: String,
    },
    #[error("the base has no /usr/bin/perl or /bin/perl to run the shim")]
    NoPerl,
    #[error("`{0}` is a shell builtin: the shell never runs a shim for it")]
    Builtin(String),
}

impl From<FuzzError> for PerturbError {
    fn from(e: FuzzError) -> Self {
        match e {
            FuzzError::BadTool(_) => PerturbError::BadParam {
                param: "tool".into(),
                reason: e.to_string(),
            },
            _ => PerturbError::NotApplicable(e.to_string()),
        }
    }
}

/// The mutations, in the order of the docs.
pub const MUTATIONS: &[&str] = &[
    "header",
    "status-line",
    "delay",
    "columns",
    "crlf",
    "stderr-interleave",
    "truncate",
    "localized-numbers",
];

/// Tools a tool-specific mutation understands.
fn tools_for(mutation: &str) -> Option<&'static [&'static str]> {
    match mutation {
        "status-line" => Some(&["curl", "wget"]),
        "columns" => Some(&["ls", "df", "ps"]),
        _ => None,
    }
}

/// Commands that POSIX shells (dash, bash) run as builtins whatever the `PATH` says.
const BUILTINS: &[&str] = &[
    "[", "alias", "bg", "break", "cd", "command", "continue", "echo", "eval", "exec", "exit",
    "export", "false", "fg", "getopts", "hash", "jobs", "kill", "printf", "pwd", "read",
    "readonly", "return", "set", "shift", "test", "times", "trap", "true", "type", "ulimit",
    "umask", "unalias", "unset", "wait",
];

/// Where the shims keep the tools they shadow when the tool itself was in the shim's place.
pub const REAL_DIR: &str = "/usr/local/lib/envfactory/real";

pub static OUTPUT_MUTATION: Info = Info {
    name: "output-mutation",
    family: Family::ToolOutput,
    summary: "a tool prints differently (banners, malformed status, delays, columns, CRLF, \
              stderr, truncation, localised numbers) while doing the same thing",
    mechanism: "perl shim at /usr/local/bin/<tool> (first on the default PATH): runs the real \
                tool by absolute path, pipes its output through a seeded mutator, exits with \
                its status",
    params: &[
        ParamSpec {
            name: "tool",
            kind: Kind::Str,
            default: "ls",
            realistic: "tools agents parse: ls, df, ps, curl, grep, find, du, tar, git",
            help: "the tool whose output is mutated",
        },
        ParamSpec {
            name: "mutation",
            kind: Kind::Choice(MUTATIONS),
            default: "header",
            realistic: "all happen: motd/locale warnings, proxies, slow NFS, other \
                        versions, Windows files, wrappers, pagers, locales",
            help: "what is done to the output",
        },
        ParamSpec {
            name: "delay_ms",
            kind: Kind::Int {
                min: 0,
                max: 60_000,
            },
            default: "500",
            realistic: "100-5000",
            help: "delay: pause before the first line (some lines pause up to a quarter more)",
        },
        ParamSpec {
            name: "keep_lines",
            kind: Kind::Int {
                min: 0,
                max: 1_000_000,
            },
            default: "0",
            realistic: "1-50 (0: 1-10 from the seed)",
            help: "truncate: lines kept",
        },
        ParamSpec {
            name: "lines",
            kind: Kind::Int { min: 0, max: 10 },
            default: "0",
            realistic: "1-3 (0: 1-3 from the seed)",
            help: "header: banner lines added",
        },
        ParamSpec {
            name: "share",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "0.3",
            realistic: "0.1-0.5",
            help: "stderr-interleave: share of stdout lines sent to stderr",
        },
        ParamSpec {
            name: "crlf_share",
            kind: Kind::Float { min: 0.0, max: 1.0 },
            default: "1",
            realistic: "1 (a Windows tool), 0.2-0.8 (mixed files)",
            help: "crlf: share of lines ending in CRLF",
        },
        ParamSpec {
            name: "columns",
            kind: Kind::Choice(&["reorder", "rename", "both"]),
            default: "both",
            realistic: "both (other versions and flavours of the tool)",
            help: "columns: what happens to the table (ls has no header: reorder only)",
        },
        ParamSpec {
            name: "style",
            kind: Kind::Choice(&["seeded", "de", "fr", "ch"]),
            default: "seeded",
            realistic: "de_DE 1.234.567,8; fr_FR 1 234 567,8; de_CH 1'234'567.8",
            help: "localized-numbers: the number format",
        },
    ],
};

pub struct OutputMutation;

fn valid_tool(t: &str) -> bool {
    !t.is_empty()
        && t != "."
        && t != ".."
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c))
}

/// A perl single-quoted string literal.
fn perl_str(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

impl Perturbation for OutputMutation {
    fn info(&self) -> &'static Info {
        &OUTPUT_MUTATION
    }

    fn apply(
        &self,
        params: &Params,
        purpose: &str,
        b: &mut Builder,
    ) -> Result<String, PerturbError> {
        let tool = params.str("tool").trim().to_string();
        let mutation = params.str("mutation").to_string();
        if !valid_tool(&tool) {
            return Err(FuzzError::BadTool(tool).into());
        }
        if BUILTINS.contains(&tool.as_str()) {
            return Err(FuzzError::Builtin(tool).into());
        }
        if let Some(tools) = tools_for(&mutation) {
            if !tools.contains(&tool.as_str()) {
                return Err(FuzzError::WrongTool {
                    mutation,
                    tool,
                    tools: tools.join(", "),
                }
                .into());
            }
        }
        let perl = ["/usr/bin/perl", "/bin/perl"]
            .into_iter()
            .find(|p| {
                b.meta(p)
                    .is_some_and(|m| m.is_symlink || m.mode & 0o111 != 0)
            })
            .ok_or(FuzzError::NoPerl)?;
        let found = b
            .which(&tool, DEFAULT_PATH)
            .ok_or_else(|| FuzzError::NoTool(tool.clone()))?;
        // The shim goes where the shell finds the tool when that is before /usr/local/bin
        // (/usr/local/sbin), else into /usr/local/bin.
        let shim = if found.starts_with("/usr/local/sbin/") {
            found.clone()
        } else {
            format!("/usr/local/bin/{tool}")
        };
        let real = if found == shim {
            // The tool (or an earlier shim) is in the shim's place: keep it aside, so shims
            // stack.
            let data = b
                .read(&found)
                .ok_or_else(|| FuzzError::NoTool(tool.clone()))?;
            let mode = b
                .meta(&found)
                .map_or(0o755, |m| if m.is_symlink { 0o755 } else { m.mode });
            let mut k = 0;
            let kept = loop {
                let p = format!("{REAL_DIR}/{tool}.{k}");
                if !b.exists(&p) {
                    break p;
                }
                k += 1;
            };
            b.write(&kept, data, mode)?;
            kept
        } else {
            found
        };
        let seed = (b.rng(purpose).next_u32() | 1) as u64;
        let config = [
            ("tool", perl_str(&tool)),
            ("real", perl_str(&real)),
            ("mutation", perl_str(&mutation)),
            ("seed", seed.to_string()),
            ("delay_ms", params.int("delay_ms").to_string()),
            ("keep_lines", params.int("keep_lines").to_string()),
            ("lines", params.int("lines").to_string()),
            ("share", params.float("share").to_string()),
            ("crlf_share", params.float("crlf_share").to_string()),
            ("columns", perl_str(params.str("columns"))),
            ("style", perl_str(params.str("style"))),
        ]
        .iter()
        .map(|(k, v)| format!("    {k} => {v},\n"))
        .collect::<String>();
        let script = format!(
            "#!{perl}\n# envfactory output-mutation shim: `{tool}` ({real}) prints through a \
             mutator ({mutation}).\nour %C = (\n{config});\n{MUTATOR}"
        );
        b.write(&shim, script, 0o755)?;
        tracing::debug!(%tool, %real, %mutation, %shim, "output mutation shim");
        Ok(format!(
            "{shim} runs {real} through `{mutation}` (seed {seed})"
        ))
    }
}

pub fn all() -> Vec<&'static dyn Perturbation> {
    vec![&OutputMutation]
}

/// The mutator, after the shim's `%C`. perl-base only (no module beyond `strict`).
const MUTATOR: &str = r##"use strict;
no warnings;
binmode STDOUT; binmode STDERR;
our %C;
my $M = $C{mutation};
my $S = ($C{seed} & 0xFFFFFFFF) || 1;
# xorshift32: the same numbers on every perl.
sub rnd { $S ^= ($S << 13) & 0xFFFFFFFF; $S ^= $S >> 17; $S ^= ($S << 5) & 0xFFFFFFFF; $S / 4294967296 }
sub pick { $_[int(rnd() * @_)] }
rnd() for 1 .. 16;
# Linux errno values (Errno.pm costs milliseconds per run).
sub EINTR () { 4 }
sub EAGAIN () { 11 }
sub nap { select(undef, undef, undef, $_[0] / 1000) if $_[0] > 0 }
sub unmutated { exec { $C{real} } $C{tool}, @ARGV; print STDERR "$C{tool}: $C{real}: $!\n"; exit 127 }

# Output is an observation only when it goes where the command's own output goes (the pipe the
# sandbox reads, the session leader's stdout). Into a file, another program or `$(...)` it is
# data, and the tool writes it itself: a mutation never changes a tool's effect.
sub observed {
    my @me = stat(STDOUT) or return 0;
    open(my $st, '<', '/proc/self/stat') or return 0;
    my $l = <$st>; close $st;
    $l =~ s/^.*\)\s+//;
    my $sid = (split ' ', $l)[3];
    my @lead = stat("/proc/$sid/fd/1") or return 0;
    return $me[0] == $lead[0] && $me[1] == $lead[1];
}
# (A shell may point its own stdout at a redirection's file while it runs the command, so a
# regular file is checked first.)
unmutated() if -f STDOUT || !observed();
my $err_too = $M eq 'status-line';
pipe(my $or, my $ow) or unmutated();
my ($er, $ew);
if ($err_too) { pipe($er, $ew) or unmutated(); }
my $pid = fork();
unmutated() unless defined $pid;
if ($pid == 0) {
    close $or; close $er if $er;
    open(STDOUT, '>&', $ow) or exit 126;
    open(STDERR, '>&', $ew) or exit 126 if $ew;
    close $ow; close $ew if $ew;
    exec { $C{real} } $C{tool}, @ARGV;
    print STDERR "$C{tool}: $C{real}: $!\n";
    exit 127;
}
close $ow; close $ew if $ew;
$SIG{PIPE} = 'IGNORE';
# Signals meant for the tool (timeout, kill, Ctrl-C) reach it.
my %SIGNAME = (1 => 'HUP', 2 => 'INT', 3 => 'QUIT', 10 => 'USR1', 12 => 'USR2', 14 => 'ALRM', 15 => 'TERM');
for my $name (values %SIGNAME) { $SIG{$name} = sub { kill $name, $pid; }; }
my %fh = (out => $or);
$fh{err} = $er if $er;
my %broken;

sub out {
    my ($k, $s) = @_;
    return if $broken{$k} || !length $s;
    my $fh = $k eq 'err' ? \*STDERR : \*STDOUT;
    my $off = 0;
    while ($off < length $s) {
        my $w = syswrite($fh, $s, length($s) - $off, $off);
        if (!defined $w) {
            next if $! == EINTR;
            $broken{$k} = 1;
            # Our reader went away: so does the tool's, as without the shim (SIGPIPE).
            if ($fh{$k}) { close $fh{$k}; delete $fh{$k}; }
            return;
        }
        $off += $w;
    }
}

# --- the mutations ---------------------------------------------------------------------------

my @BANNERS = (
    "WARNING: terminal is not fully functional",
    "perl: warning: Setting locale failed.",
    "bash: warning: setlocale: LC_ALL: cannot change locale (en_US.UTF-8)",
    "Welcome to Ubuntu 22.04.4 LTS (GNU/Linux 5.15.0-105-generic x86_64)",
    "*** System restart required ***",
    "You have new mail in /var/mail/root",
    "tput: No value for \$TERM and no -T specified",
    "Last login: Tue Mar  5 09:12:44 2024 from 10.0.2.2",
    "stty: 'standard input': Inappropriate ioctl for device",
    "$C{tool}: warning: /etc/$C{tool}rc is deprecated, see /etc/$C{tool}.d/",
    "(process:4242): GLib-WARNING **: 09:12:44.123: cannot open display",
    "NOTICE: this system will be rebooted for maintenance at 02:00 UTC",
);

my $variant = 0;
my ($TH, $DEC) = ('.', ',');
my $keep = 0;
my $lineno = 0;
my @held;

sub init {
    if ($M eq 'header') {
        my $n = $C{lines} || 1 + int(rnd() * 3);
        my @b = @BANNERS;
        for my $i (reverse 1 .. $#b) { my $j = int(rnd() * ($i + 1)); @b[$i, $j] = @b[$j, $i]; }
        out('out', "$_\n") for @b[0 .. $n - 1];
    } elsif ($M eq 'status-line') {
        $variant = int(rnd() * 8);
    } elsif ($M eq 'truncate') {
        $keep = $C{keep_lines} || 1 + int(rnd() * 10);
    } elsif ($M eq 'localized-numbers') {
        my $style = $C{style} eq 'seeded' ? pick('de', 'fr', 'ch') : $C{style};
        ($TH, $DEC) = $style eq 'de' ? ('.', ',') : $style eq 'fr' ? ("\xe2\x80\xaf", ',') : ("'", '.');
    }
}

sub status {
    my $l = shift;
    return $l unless $l =~ m{^(< |\s*)HTTP/([\d.]+) (\d{3})(?: ([^\r\n]*))?(\r?\n?)\z};
    my ($p, $v, $c, $r, $e) = ($1, $2, $3, defined $4 ? $4 : '', $5);
    my $w = $v eq '1.0' ? '1.1' : '1.0';
    my @v = (
        "HTTP/$v $c",                  # no reason phrase
        "HTTP/$w $c $r",               # another version
        lc("http/$v $c $r"),           # lower case
        "HTTP/$v  $c  $r",             # doubled spaces
        "HTTP/$v $c-$r",               # wrong separator
        "HTTP $c $r",                  # no version
        "$c $r HTTP/$v",               # fields swapped
        "HTTP/$v:$c $r",               # colon
    );
    return $p . $v[$variant] . $e;
}

sub localize {
    my $l = shift;
    my $group = sub {
        my $d = shift;
        return $d if length($d) < 5;
        1 while $d =~ s/^(\d+)(\d{3})/$1$TH$2/;
        $d;
    };
    $l =~ s{(?<![\w,'.])(\d+)(?:\.(\d+))?(?![\d,'_]|\.\d)}{$group->($1) . (defined $2 ? "$DEC$2" : '')}ge;
    $l;
}

my %RENAME = (
    'Filesystem' => ['Device', 'Source', 'FS'],
    '1K-blocks' => ['Size', 'Blocks', '1024-blocks', 'Total'],
    'Size' => ['Total', 'Blocks'],
    'Used' => ['Usage', 'InUse'],
    'Available' => ['Avail', 'Free'],
    'Avail' => ['Available', 'Free'],
    'Use%' => ['Capacity', 'Pct', 'Used%'],
    'Mounted on' => ['Mountpoint', 'Target', 'Mount'],
    'Type' => ['FSType', 'Kind'],
    'Inodes' => ['Files', 'Total'],
    'IUsed' => ['Used', 'FUsed'],
    'IFree' => ['Free', 'FFree'],
    'IUse%' => ['Use%', 'FUse%'],
    'PID' => ['Pid', 'ID', 'Process'],
    'PPID' => ['Parent', 'PPid'],
    'TTY' => ['TT', 'Term', 'Terminal'],
    'TIME' => ['CPUTIME', 'CPU-Time'],
    'CMD' => ['COMMAND', 'Command', 'Args'],
    'COMMAND' => ['CMD', 'Cmd', 'Args'],
    'USER' => ['UID', 'Owner', 'User'],
    'UID' => ['USER', 'Owner'],
    '%CPU' => ['CPU%', 'CPU'],
    '%MEM' => ['MEM%', 'MEM'],
    'VSZ' => ['VSIZE', 'Virt'],
    'RSS' => ['RES', 'RSZ'],
    'STAT' => ['S', 'State'],
    'START' => ['STARTED', 'Start'],
    'STIME' => ['START', 'Started'],
    'C' => ['CP', 'CPU'],
);

# A shuffled, never identical, order of 0..$n-1.
sub perm {
    my $n = shift;
    my @p = (0 .. $n - 1);
    for my $i (reverse 1 .. $#p) { my $j = int(rnd() * ($i + 1)); @p[$i, $j] = @p[$j, $i]; }
    @p[0, 1] = @p[1, 0] if $n >= 2 && join(',', @p) eq join(',', 0 .. $n - 1);
    @p;
}

sub numeric { $_[0] =~ /^[-+]?[\d.,:%]+[KMGTPkB]?$|^-$/ }

# Lay out rows (array refs of equal length): the last column as is, the others padded.
sub layout {
    my @rows = @_;
    my $n = @{$rows[0]};
    my (@w, @num);
    for my $j (0 .. $n - 2) {
        $num[$j] = 1;
        for my $r (@rows[1 .. $#rows]) {
            my $x = $r->[$j];
            $w[$j] = length $x if length($x) > ($w[$j] || 0);
            $num[$j] = 0 unless numeric($x);
        }
        $w[$j] = length $rows[0][$j] if length($rows[0][$j]) > ($w[$j] || 0);
    }
    map {
        my $r = $_;
        join(' ', (map { $num[$_] ? sprintf('%*s', $w[$_], $r->[$_]) : sprintf('%-*s', $w[$_], $r->[$_]) } 0 .. $n - 2), $r->[$n - 1]);
    } @rows;
}

sub columns_mutate {
    my @lines = @_;
    return @lines unless @lines;
    my ($eol) = $lines[0] =~ /(\r?\n)\z/;
    $eol = "\n" unless defined $eol;
    my $how = $C{columns};
    if ($C{tool} eq 'ls') {
        my @p = perm(5);
        my (@idx, @rows);
        for my $i (0 .. $#lines) {
            my $x = $lines[$i];
            $x =~ s/\r?\n\z//;
            next unless $x =~ /^[-dlcbpsD][-rwxsStTl]{9}[.+@]?\s/;
            my @f = split ' ', $x, 9;
            if (@f >= 5 && $f[4] =~ /,$/) { @f = split ' ', $x, 10; $f[4] .= ' ' . splice(@f, 5, 1); }
            next unless @f == 9;
            my @mid = ($f[1], $f[2], $f[3], $f[4], "$f[5] $f[6] $f[7]");
            push @idx, $i;
            push @rows, [$f[0], @mid[@p], $f[8]];
        }
        return @lines unless @rows;
        # ls has no header: lay out with a dummy one.
        my @out = layout([('') x 7], @rows);
        shift @out;
        $lines[$idx[$_]] = $out[$_] . $eol for 0 .. $#idx;
        return @lines;
    }
    my $h = $lines[0];
    $h =~ s/\r?\n\z//;
    $h =~ s/Mounted on/Mounted\x00on/;
    my @names = map { my $x = $_; $x =~ s/\x00/ /; $x } split ' ', $h;
    my $n = @names;
    return @lines if $n < 2;
    my @p = $how eq 'rename' ? (0 .. $n - 2) : perm($n - 1);
    if ($how ne 'reorder') {
        my $renamed = 0;
        for my $j (0 .. $n - 1) {
            my $s = $RENAME{$names[$j]} or next;
            if (rnd() < 0.5) { $names[$j] = pick(@$s); $renamed++; }
        }
        if (!$renamed) {
            for my $j (0 .. $n - 1) {
                my $s = $RENAME{$names[$j]} or next;
                $names[$j] = pick(@$s);
                last;
            }
        }
    }
    my @rows = ([@names[@p], $names[$n - 1]]);
    my @raw;
    for my $i (1 .. $#lines) {
        my $x = $lines[$i];
        $x =~ s/\r?\n\z//;
        my @f = split ' ', $x, $n;
        if (@f == $n) { push @rows, [@f[@p], $f[$n - 1]]; push @raw, undef; }
        else { push @raw, $lines[$i]; }
    }
    my @out = layout(@rows);
    my @res = (shift(@out) . $eol);
    for my $r (@raw) { push @res, defined $r ? $r : shift(@out) . $eol; }
    @res;
}

sub line {
    my ($k, $l) = @_;
    if ($k eq 'err') { out('err', $M eq 'status-line' ? status($l) : $l); return; }
    $lineno++;
    if ($M eq 'status-line') { out('out', status($l)); }
    elsif ($M eq 'delay') {
        if ($lineno == 1) { nap($C{delay_ms}); out('out', $l); }
        elsif (rnd() < 0.25) {
            my $cut = int(rnd() * length $l);
            out('out', substr($l, 0, $cut));
            nap(int(rnd() * $C{delay_ms} / 4));
            out('out', substr($l, $cut));
        } else { out('out', $l); }
    }
    elsif ($M eq 'columns') { push @held, $l; }
    elsif ($M eq 'crlf') { $l =~ s/\r?\n\z/\r\n/ if rnd() < $C{crlf_share}; out('out', $l); }
    elsif ($M eq 'stderr-interleave') { out(rnd() < $C{share} ? 'err' : 'out', $l); }
    elsif ($M eq 'truncate') { out('out', $l) if $lineno <= $keep; }
    elsif ($M eq 'localized-numbers') { out('out', localize($l)); }
    else { out('out', $l); }
}

init();
my %buf = (out => '', err => '');
while (%fh) {
    my $rin = '';
    vec($rin, fileno($fh{$_}), 1) = 1 for keys %fh;
    my $n = select(my $rout = $rin, undef, undef, undef);
    if ($n < 0) { next if $! == EINTR; last; }
    for my $k (sort keys %fh) {
        next unless $fh{$k} && vec($rout, fileno($fh{$k}), 1);
        my $r = sysread($fh{$k}, my $chunk, 65536);
        if (!defined $r) { next if $! == EINTR || $! == EAGAIN; $r = 0; }
        if (!$r) {
            close $fh{$k}; delete $fh{$k};
            line($k, $buf{$k}) if length $buf{$k};
            $buf{$k} = '';
            next;
        }
        $buf{$k} .= $chunk;
        my $pos = 0;
        while ((my $i = index($buf{$k}, "\n", $pos)) >= 0) {
            line($k, substr($buf{$k}, $pos, $i - $pos + 1));
            $pos = $i + 1;
        }
        substr($buf{$k}, 0, $pos, '');
    }
}
out('out', $_) for ($M eq 'columns' ? columns_mutate(@held) : ());
my $st = 0;
while (1) {
    my $w = waitpid($pid, 0);
    if ($w == $pid) { $st = $?; last; }
    next if $w == -1 && $! == EINTR;
    $st = 127 << 8;
    last;
}
if ($st & 127) {
    # Die of the tool's signal.
    $SIG{$_} = 'DEFAULT' for 'PIPE', values %SIGNAME;
    kill $st & 127, $$;
    exit 128 + ($st & 127);
}
exit($st >> 8);
"##;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{BaseView, Resources};

    fn base_with(files: &[(&str, u32)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (p, mode) in files {
            let host = dir.path().join(&p[1..]);
            std::fs::create_dir_all(host.parent().unwrap()).unwrap();
            std::fs::write(&host, format!("binary {p}")).unwrap();
            std::fs::set_permissions(&host, std::os::unix::fs::PermissionsExt::from_mode(*mode))
                .unwrap();
        }
        dir
    }

    fn apply(b: &mut Builder, spec: &str, i: usize) -> Result<String, PerturbError> {
        let c = crate::perturb::parse_spec(spec)?;
        OutputMutation.apply(&c.params, &format!("output-mutation#{i}"), b)
    }

    fn shim_real(b: &Builder, path: &str) -> String {
        let s = String::from_utf8(b.read(path).unwrap()).unwrap();
        let l = s
            .lines()
            .find(|l| l.trim_start().starts_with("real =>"))
            .unwrap();
        l.split('\'').nth(1).unwrap().to_string()
    }

    #[test]
    fn shims_find_the_real_tool_and_stack() {
        let dir = base_with(&[("/usr/bin/perl", 0o755), ("/usr/bin/ls", 0o755)]);
        let base = BaseView::from_dirs(vec![dir.path().to_path_buf()]);
        let mut b = Builder::new(&base, 1, Resources::default());
        apply(&mut b, "output-mutation:tool=ls,mutation=crlf", 0).unwrap();
        let shim = b.read("/usr/local/bin/ls").unwrap();
        assert!(shim.starts_with(b"#!/usr/bin/perl\n"));
        assert_eq!(b.meta("/usr/local/bin/ls").unwrap().mode, 0o755);
        assert_eq!(shim_real(&b, "/usr/local/bin/ls"), "/usr/bin/ls");
        // A second mutation of the same tool runs the first shim, kept aside.
        apply(&mut b, "output-mutation:tool=ls,mutation=header", 1).unwrap();
        assert_eq!(
            shim_real(&b, "/usr/local/bin/ls"),
            format!("{REAL_DIR}/ls.0")
        );
        assert_eq!(b.read(&format!("{REAL_DIR}/ls.0")).unwrap(), shim);
        // Deterministic bytes.
        let mut again = Builder::new(&base, 1, Resources::default());
        apply(&mut again, "output-mutation:tool=ls,mutation=crlf", 0).unwrap();
        assert_eq!(again.read("/usr/local/bin/ls").unwrap(), shim);
    }

    #[test]
    fn refusals_are_not_applicable_or_bad_params() {
        let dir = base_with(&[("/usr/bin/perl", 0o755), ("/usr/bin/ls", 0o755)]);
        let base = BaseView::from_dirs(vec![dir.path().to_path_buf()]);
        let mut b = Builder::new(&base, 1, Resources::default());
        for spec in [
            "output-mutation:tool=ls,mutation=status-line",
            "output-mutation:tool=tar,mutation=crlf",
            "output-mutation:tool=echo,mutation=crlf",
        ] {
            assert!(
                matches!(apply(&mut b, spec, 0), Err(PerturbError::NotApplicable(_))),
                "{spec}"
            );
        }
        assert!(matches!(
            apply(&mut b, "output-mutation:tool=../ls,mutation=crlf", 0),
            Err(PerturbError::BadParam { .. })
        ));
        let no_perl = base_with(&[("/usr/bin/ls", 0o755)]);
        let base = BaseView::from_dirs(vec![no_perl.path().to_path_buf()]);
        let mut b = Builder::new(&base, 1, Resources::default());
        assert!(matches!(
            apply(&mut b, "output-mutation:tool=ls,mutation=crlf", 0),
            Err(PerturbError::NotApplicable(_))
        ));
    }

    #[test]
    fn tool_names_and_perl_strings() {
        assert!(valid_tool("ls") && valid_tool("python3.11") && valid_tool("g++"));
        assert!(!valid_tool("a/b") && !valid_tool("..") && !valid_tool("") && !valid_tool("a b"));
        assert_eq!(perl_str(r"it's \ ok"), r"'it\'s \\ ok'");
    }

    #[test]
    fn tool_specific_mutations_name_their_tools() {
        assert!(tools_for("columns").is_some_and(|t| t.contains(&"ps")));
        assert!(tools_for("status-line").is_some_and(|t| t == ["curl", "wget"]));
        assert!(tools_for("crlf").is_none());
        for m in MUTATIONS {
            assert!(MUTATIONS.iter().filter(|x| *x == m).count() == 1);
        }
    }
}
