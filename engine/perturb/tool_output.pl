use strict;
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
