//! The strict reader against GNU tar on the same bytes: archives written by real tools and
//! hand-made ones must list the same members (name, type, size) as `tar -tvzf`, and every
//! ambiguous archive must be refused. For each refused one the test also shows why it is
//! ambiguous: GNU tar fails on it, or lists other members than a lax reader (the `tar` crate)
//! does, or the case is refused by rule although both agree.

use super::*;
use std::io::Write;
use std::process::{Command, Stdio};

const LIMITS: Limits = Limits {
    max_unpacked: 64 << 20,
    max_members: 10_000,
};

/// One header block: `name` in the name field (`prefix` in the ustar prefix), the type flag,
/// the size, the link name, the magic (`true`: GNU `ustar  \0`; `false`: ustar `ustar\0 00`).
fn header(name: &str, prefix: &str, typeflag: u8, size: u64, link: &str, gnu: bool) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"14000000000\0");
    h[156] = typeflag;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    if gnu {
        h[257..265].copy_from_slice(b"ustar  \0");
    } else {
        h[257..265].copy_from_slice(b"ustar\x0000");
        h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    }
    h[265..269].copy_from_slice(b"root");
    h[297..301].copy_from_slice(b"root");
    seal(&mut h);
    h
}

/// Write the checksum of a header block.
fn seal(h: &mut [u8]) {
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

fn pad(d: &[u8]) -> Vec<u8> {
    let mut v = d.to_vec();
    v.resize(d.len().div_ceil(512) * 512, 0);
    v
}

/// A regular member (GNU magic).
fn file(name: &str, data: &[u8]) -> Vec<u8> {
    let mut v = header(name, "", b'0', data.len() as u64, "", true);
    v.extend(pad(data));
    v
}

fn dir(name: &str) -> Vec<u8> {
    header(name, "", b'5', 0, "", true)
}

/// A meta header (`L`, `K` or `x`) with its data.
fn meta(typeflag: u8, data: &[u8]) -> Vec<u8> {
    let mut v = header("././@LongLink", "", typeflag, data.len() as u64, "", true);
    v.extend(pad(data));
    v
}

fn pax(records: &[(&str, &str)]) -> Vec<u8> {
    let mut d = Vec::new();
    for (k, v) in records {
        let body = format!(" {k}={v}\n");
        let mut n = body.len() + 1;
        while n.to_string().len() + body.len() != n {
            n += 1;
        }
        d.extend(format!("{n}{body}").as_bytes());
    }
    meta(b'x', &d)
}

fn end() -> Vec<u8> {
    vec![0u8; 1024]
}

fn gz(tar: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(tar).unwrap();
    e.finish().unwrap()
}

fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

type Listing = Vec<(String, char, u64)>;

/// `tar -tvzf -` of GNU tar on these bytes: its exit status and its listing.
fn gnu_list(bytes: &[u8]) -> (bool, Listing) {
    let mut child = Command::new("tar")
        .args(["--quoting-style=literal", "-tvzf", "-"])
        .env("LC_ALL", "C")
        .env("TZ", "UTC")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("GNU tar must be installed to test the strict reader against it");
    let mut stdin = child.stdin.take().unwrap();
    let data = bytes.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    let mut list = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // perms owner/group size date time name
        let mut rest = line;
        let mut f = Vec::new();
        for _ in 0..5 {
            rest = rest.trim_start_matches(' ');
            let end = rest.find(' ').unwrap_or(rest.len());
            f.push(&rest[..end]);
            rest = &rest[end..];
        }
        let mut name = rest.strip_prefix(' ').unwrap_or(rest);
        let t = f[0].chars().next().unwrap_or('?');
        if t == 'h' {
            name = name.split(" link to ").next().unwrap_or(name);
        } else if t == 'l' {
            name = name.split(" -> ").next().unwrap_or(name);
        }
        let n = normalise(name).map(|x| x.0).unwrap_or_else(|e| e);
        list.push((n, t, f[2].parse().unwrap_or(u64::MAX)));
    }
    (out.status.success(), list)
}

fn ours(bytes: &[u8]) -> Result<Listing, String> {
    read_tar_gz(bytes, LIMITS).map(|ms| {
        ms.iter()
            .map(|m| (m.name.clone(), m.type_char(), m.size()))
            .collect()
    })
}

/// A lax reader (the `tar` crate, as the old verifier used it): its names and types.
fn lax(bytes: &[u8]) -> Result<Vec<(String, char)>, String> {
    let dec = flate2::read::MultiGzDecoder::new(bytes).take(64 << 20);
    let mut ar = tar::Archive::new(dec);
    let mut out = Vec::new();
    for e in ar.entries().map_err(|e| e.to_string())? {
        let e = e.map_err(|e| e.to_string())?;
        let p = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let t = match e.header().entry_type() {
            tar::EntryType::Directory => 'd',
            tar::EntryType::Regular => '-',
            tar::EntryType::Link => 'h',
            tar::EntryType::Symlink => 'l',
            _ => '?',
        };
        out.push((normalise(&p).map(|x| x.0).unwrap_or(p), t));
    }
    Ok(out)
}

/// Why an archive is refused.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Why {
    /// GNU tar itself fails on it.
    GnuFails,
    /// GNU tar and a lax reader list different members.
    Differs,
    /// Both read it alike, refused by rule (truncation, limits, odd formats).
    Rule,
}

fn agree(label: &str, bytes: &[u8]) {
    let (ok, gnu) = gnu_list(bytes);
    assert!(ok, "{label}: GNU tar fails on it");
    let mine = ours(bytes).unwrap_or_else(|e| panic!("{label}: refused: {e}"));
    assert_eq!(mine, gnu, "{label}: the listings differ");
}

fn refused(label: &str, bytes: &[u8], why: Why, says: &str) {
    let e = ours(bytes).expect_err(label);
    assert!(e.contains(says), "{label}: refused for another reason: {e}");
    let (ok, gnu) = gnu_list(bytes);
    let lax = lax(bytes);
    let gnu_names: Vec<(String, char)> = gnu.iter().map(|m| (m.0.clone(), m.1)).collect();
    match why {
        Why::GnuFails => assert!(!ok, "{label}: GNU tar reads it: {gnu:?}"),
        Why::Differs => assert!(
            ok && lax.as_ref().is_ok_and(|l| *l != gnu_names),
            "{label}: GNU tar ({ok}) {gnu:?} and the lax reader {lax:?} agree"
        ),
        Why::Rule => {}
    }
}

#[test]
fn hand_made_archives_agree_with_gnu_tar_or_are_refused() {
    let a = file("srv/app/a.log", b"alpha\n");
    let b = file("srv/app/logs/b b.log", b"bravo\n");
    let decoy = file("srv/app/notes.txt", b"a decoy\n");

    // Accepted, and listed as GNU tar lists them.
    agree(
        "plain",
        &gz(&cat(&[dir("srv/app/"), a.clone(), b.clone(), end()])),
    );
    agree(
        "leading ./ and /, doubled slashes",
        &gz(&cat(&[
            file("./srv/app/a.log", b"1"),
            file("srv//app/./c.log", b"22"),
            dir("./"),
            end(),
        ])),
    );
    agree(
        "ustar prefix + name",
        &gz(&cat(&[
            header("a.log", "srv/app/logs", b'0', 3, "", false),
            pad(b"abc"),
            end(),
        ])),
    );
    let long = format!("srv/app/{}/x.log", "d".repeat(120));
    agree(
        "GNU long name",
        &gz(&cat(&[
            meta(b'L', format!("{long}\0").as_bytes()),
            file("srv/app/ddd", b"abc"),
            end(),
        ])),
    );
    agree(
        "PAX path, mtime and size equal to the header's",
        &gz(&cat(&[
            pax(&[("path", &long), ("mtime", "1700000000.25"), ("size", "3")]),
            header("x.log", "", b'0', 3, "", false),
            pad(b"abc"),
            end(),
        ])),
    );
    agree(
        "a hard link to an earlier file, and to itself",
        &gz(&cat(&[
            a.clone(),
            header("srv/app/h.log", "", b'1', 0, "srv/app/a.log", true),
            header("srv/app/a.log", "", b'1', 0, "srv/app/a.log", true),
            end(),
        ])),
    );
    agree(
        "a symlink, a fifo, the same file twice",
        &gz(&cat(&[
            header("srv/app/s", "", b'2', 0, "a.log", true),
            header("srv/app/f", "", b'6', 0, "", true),
            a.clone(),
            a.clone(),
            end(),
        ])),
    );
    agree(
        "two gzip members splitting one archive",
        &cat(&[gz(&a), gz(&cat(&[b.clone(), end()]))]),
    );
    agree(
        "a record's worth of zeros at the end",
        &gz(&cat(&[a.clone(), vec![0u8; 10240]])),
    );

    // Refused: name precedence.
    refused(
        "GNU long name, then a PAX path",
        &gz(&cat(&[
            b.clone(),
            meta(b'L', b"srv/app/a.log\0"),
            pax(&[("path", "srv/app/notes.txt")]),
            file("srv/app/a.log", b"alpha\n"),
            end(),
        ])),
        Why::Differs,
        "both a GNU long name and a PAX path",
    );
    refused(
        "PAX path, then a GNU long name",
        &gz(&cat(&[
            pax(&[("path", "srv/app/notes.txt")]),
            meta(b'L', b"srv/app/a.log\0"),
            file("srv/app/a.log", b"alpha\n"),
            end(),
        ])),
        Why::Differs,
        "both a GNU long name and a PAX path",
    );
    refused(
        "two long names",
        &gz(&cat(&[
            meta(b'L', b"srv/app/notes.txt\0"),
            meta(b'L', b"srv/app/a.log\0"),
            file("x", b"alpha\n"),
            end(),
        ])),
        Why::Rule,
        "two GNU long names",
    );
    refused(
        "a PAX sparse name",
        &gz(&cat(&[
            pax(&[
                ("path", "srv/app/a.log"),
                ("GNU.sparse.name", "srv/app/notes.txt"),
                ("GNU.sparse.major", "0"),
                ("GNU.sparse.minor", "0"),
                ("GNU.sparse.numblocks", "1"),
                ("GNU.sparse.offset", "0"),
                ("GNU.sparse.numbytes", "6"),
                ("GNU.sparse.size", "6"),
            ]),
            header("a.log", "", b'0', 6, "", false),
            pad(b"alpha\n"),
            end(),
        ])),
        Why::Differs,
        "GNU.sparse",
    );
    refused(
        "a global PAX header",
        &gz(&cat(&[
            {
                let mut m = pax(&[("comment", "x")]);
                m[156] = b'g';
                seal(&mut m[..512]);
                m
            },
            a.clone(),
            end(),
        ])),
        Why::Rule,
        "global PAX header",
    );
    refused(
        "a PAX charset keyword",
        &gz(&cat(&[pax(&[("hdrcharset", "BINARY")]), a.clone(), end()])),
        Why::Rule,
        "hdrcharset",
    );

    // Refused: data where GNU tar does not skip it, or sizes read two ways.
    refused(
        "a directory that carries a member as data",
        &gz(&cat(&[
            a.clone(),
            header("srv/app/", "", b'5', decoy.len() as u64, "", true),
            decoy.clone(),
            end(),
        ])),
        Why::Differs,
        "carries",
    );
    refused(
        "a regular member named with a trailing slash",
        &gz(&cat(&[file("srv/app/a.log/", b"alpha\n"), end()])),
        Why::Differs,
        "ends in `/`",
    );
    refused(
        "a hard link whose PAX size covers a decoy",
        &gz(&cat(&[
            a.clone(),
            pax(&[("size", &decoy.len().to_string())]),
            header("srv/app/a.log", "", b'1', 0, "srv/app/a.log", true),
            decoy.clone(),
            end(),
        ])),
        Why::Rule,
        "PAX size",
    );
    refused(
        "a hard link whose header size covers a decoy",
        &gz(&cat(&[
            a.clone(),
            header(
                "srv/app/a.log",
                "",
                b'1',
                decoy.len() as u64,
                "srv/app/a.log",
                true,
            ),
            decoy.clone(),
            end(),
        ])),
        Why::Rule,
        "carries",
    );
    refused(
        "a GNU sparse member",
        &gz(&cat(&[
            header("srv/app/a.log", "", b'S', 0, "", true),
            end(),
        ])),
        Why::Rule,
        "sparse",
    );

    // Refused: ends that are not clean.
    refused(
        "a decoy after a lone zero block",
        &gz(&cat(&[a.clone(), vec![0u8; 512], decoy.clone(), end()])),
        Why::Rule,
        "after the end-of-archive block",
    );
    refused(
        "a second gzip member after the end",
        &cat(&[
            gz(&cat(&[a.clone(), end()])),
            gz(&cat(&[decoy.clone(), end()])),
        ]),
        Why::Rule,
        "after the end-of-archive block",
    );
    refused(
        "trailing garbage after the gzip stream",
        &cat(&[gz(&cat(&[a.clone(), end()])), b"garbage".to_vec()]),
        Why::GnuFails,
        "trailing data",
    );
    let whole = gz(&cat(&[a.clone(), b.clone(), end()]));
    refused(
        "a gzip stream without its trailer",
        &whole[..whole.len() - 8],
        Why::GnuFails,
        "truncated",
    );
    refused(
        "no end-of-archive block",
        &gz(&cat(&[a.clone(), b.clone()])),
        Why::Rule,
        "no end-of-archive block",
    );
    refused(
        "member data cut short",
        &gz(&cat(&[
            header("srv/app/a.log", "", b'0', 2000, "", true),
            vec![b'x'; 600],
        ])),
        Why::GnuFails,
        "cut short",
    );
    refused(
        "more members than the limit",
        &gz(&cat(&[dir("srv/app/").repeat(10_001), end()])),
        Why::Rule,
        "limit reached",
    );
    refused(
        "more bytes than the limit (a bomb)",
        &gz(&cat(&[dir("srv/app/").repeat(9_000), vec![0u8; 65 << 20]])),
        Why::Rule,
        "limit reached",
    );

    // Refused: header damage.
    let mut bad = decoy.clone();
    bad[150] ^= 1;
    refused(
        "a checksum that does not match",
        &gz(&cat(&[a.clone(), bad, end()])),
        Why::GnuFails,
        "checksum",
    );
    let mut v7 = a.clone();
    v7[257..265].copy_from_slice(&[0; 8]);
    seal(&mut v7[..512]);
    refused(
        "a v7 header",
        &gz(&cat(&[v7, end()])),
        Why::Rule,
        "neither ustar nor GNU",
    );
    let mut b256 = a.clone();
    b256[124..136].copy_from_slice(&[0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6]);
    seal(&mut b256[..512]);
    refused(
        "a base-256 size",
        &gz(&cat(&[b256, end()])),
        Why::Rule,
        "bad size field",
    );

    // Refused: names that extract elsewhere or twice.
    refused(
        "a log listed twice with other contents",
        &gz(&cat(&[
            a.clone(),
            file("./srv/app/a.log", b"forged\n"),
            end(),
        ])),
        Why::Rule,
        "listed twice",
    );
    refused(
        "a file and then a directory of the same name",
        &gz(&cat(&[a.clone(), dir("srv/app/a.log/"), end()])),
        Why::Rule,
        "listed twice",
    );
    refused(
        "a dot-dot name",
        &gz(&cat(&[file("srv/app/x/../a.log", b"alpha\n"), end()])),
        Why::Rule,
        "`..`",
    );
    refused(
        "a hard link to nothing earlier",
        &gz(&cat(&[
            header("srv/app/a.log", "", b'1', 0, "srv/app/notes.txt", true),
            end(),
        ])),
        Why::Rule,
        "hard link",
    );
    refused(
        "a member under a symlink",
        &gz(&cat(&[
            header("srv/app/logs", "", b'2', 0, "/tmp", true),
            file("srv/app/logs/b.log", b"b"),
            end(),
        ])),
        Why::Rule,
        "not a directory",
    );
    let mut not_utf8 = file("srv/app/Xa.log", b"a");
    not_utf8[8] = 0xff;
    seal(&mut not_utf8[..512]);
    refused(
        "a name that is not UTF-8",
        &gz(&cat(&[not_utf8, end()])),
        Why::Rule,
        "not UTF-8",
    );
}

/// A tree with the shapes the task has (spaces, depth, long names, a hard link, a symlink).
fn make_tree(root: &std::path::Path) {
    let long = format!("srv/app/{}", "deep ".repeat(25));
    for (p, d) in [
        ("srv/app/a.log", "alpha\n".to_string()),
        ("srv/app/old logs/slow query-2.log", "bravo\n".repeat(50)),
        ("srv/app/api/v1/access-1.log", String::new()),
        (&format!("{long}/x.log") as &str, "charlie\n".into()),
    ] {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, d).unwrap();
    }
    std::fs::hard_link(root.join("srv/app/a.log"), root.join("srv/app/hard.log")).unwrap();
    std::os::unix::fs::symlink("a.log", root.join("srv/app/sym.log")).unwrap();
}

fn run(cmd: &mut Command) -> bool {
    cmd.env("LC_ALL", "C")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn archives_of_real_tools_agree_with_gnu_tar() {
    let dir = std::env::temp_dir().join(format!("tar-strict-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    make_tree(&dir);
    let out = |n: &str| dir.join(n).to_string_lossy().into_owned();
    let mut made = Vec::new();
    for format in ["gnu", "oldgnu", "posix", "ustar"] {
        let o = out(&format!("gnu-{format}.tar.gz"));
        // ustar cannot hold the long name: everything else of the tree then.
        let what: &[&str] = if format == "ustar" {
            &["srv/app/old logs", "srv/app/a.log", "srv/app/hard.log"]
        } else {
            &["srv"]
        };
        assert!(
            run(Command::new("tar")
                .current_dir(&dir)
                .args(["--format", format, "-czf", &o])
                .args(what)),
            "GNU tar --format={format}"
        );
        made.push(o);
    }
    let py = "import sys, tarfile\n\
              for fmt in ('PAX', 'GNU', 'USTAR'):\n\
              \x20   with tarfile.open(sys.argv[1] + '/py-' + fmt + '.tar.gz', 'w:gz', \
              format=getattr(tarfile, fmt + '_FORMAT')) as t:\n\
              \x20       for p in (['srv/app/old logs', 'srv/app/a.log'] if fmt == 'USTAR' else ['srv']):\n\
              \x20           t.add(p)\n";
    // Each tool the machine has must write an archive the reader takes.
    if run(Command::new("python3").arg("--version")) {
        assert!(
            run(Command::new("python3")
                .current_dir(&dir)
                .args(["-c", py, &dir.to_string_lossy()])),
            "python3 tarfile"
        );
        for f in ["PAX", "GNU", "USTAR"] {
            made.push(out(&format!("py-{f}.tar.gz")));
        }
    }
    let pl = "use Archive::Tar; use File::Find; my @f; \
              find({no_chdir => 1, wanted => sub { push @f, $_ }}, 'srv'); \
              Archive::Tar->create_archive($ARGV[0], COMPRESS_GZIP, @f) or die;";
    if run(Command::new("perl").args(["-MArchive::Tar", "-e", "1"])) {
        assert!(
            run(Command::new("perl")
                .current_dir(&dir)
                .args(["-e", pl, &out("perl.tar.gz")])),
            "perl Archive::Tar"
        );
        made.push(out("perl.tar.gz"));
    }
    assert!(made.len() >= 4);
    for f in &made {
        let bytes = std::fs::read(f).unwrap();
        agree(f, &bytes);
        let ms = read_tar_gz(&bytes, LIMITS).unwrap();
        // The contents are the files' (a hard link carries its target's).
        let a = ms.iter().find(|m| m.name == "srv/app/a.log").unwrap();
        let want = sha256_hex(b"alpha\n");
        assert!(
            matches!(&a.kind, Kind::File { sha256, .. } | Kind::HardLink { sha256, .. } if *sha256 == want),
            "{f}: {a:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gunzip_takes_every_member_and_nothing_after() {
    let two = cat(&[gz(b"ab"), gz(b"cd")]);
    assert_eq!(gunzip(&two, 100).unwrap(), b"abcd");
    assert!(gunzip(&cat(&[two.clone(), vec![0]]), 100)
        .unwrap_err()
        .contains("trailing"));
    assert!(gunzip(&two, 3).unwrap_err().contains("limit"));
    assert!(gunzip(&two[..two.len() - 1], 100).is_err());
    assert!(gunzip(b"plain text", 100).is_err());
    let mut bad_crc = gz(b"abcd");
    let n = bad_crc.len();
    bad_crc[n - 8] ^= 1;
    assert!(gunzip(&bad_crc, 100).is_err());
}

#[test]
fn numeric_fields_and_pax_records_are_read_strictly() {
    assert_eq!(octal(b"0000644\0", "m").unwrap(), 0o644);
    assert_eq!(octal(b"  644 \0\0", "m").unwrap(), 0o644);
    assert_eq!(octal(b"\0\0\0\0", "m").unwrap(), 0);
    assert!(octal(b"0006x4\0", "m").is_err());
    assert!(octal(b"\x80\0\0\x01", "m").is_err());
    let p = pax_records(b"16 path=a/b.log\n11 size=42\n").unwrap();
    assert_eq!(p["path"], "a/b.log");
    assert_eq!(p["size"], "42");
    assert!(pax_records(b"15 path=a/b.log\n").is_err(), "wrong length");
    assert!(pax_records(b"11 size=42\n11 size=43\n").is_err(), "twice");
    assert!(pax_records(b"11 size=4x\n").is_err());
    assert!(pax_records(b"13 charset=x\n").is_err());
    assert_eq!(
        normalise("./srv//a/./b.log").unwrap(),
        ("srv/a/b.log".into(), false)
    );
    assert_eq!(normalise("/srv/x/").unwrap(), ("srv/x".into(), true));
    assert!(normalise("srv/../etc/passwd").is_err());
}

#[test]
fn a_remembered_read_is_the_fresh_read_of_the_same_bytes_and_only_of_them() {
    let a = gz(&cat(&[file("srv/a.log", b"first contents"), end()]));
    // The same length, one byte of a member's data changed (its size, name and every header
    // field unchanged): what an agent that rewrites the archive in place leaves.
    let b = gz(&cat(&[file("srv/a.log", b"first content!"), end()]));
    assert_eq!(a.len(), b.len());
    let fresh_a = read_tar_gz(&a, LIMITS);
    let fresh_b = read_tar_gz(&b, LIMITS);
    assert_ne!(fresh_a, fresh_b);
    let hits = || REMEMBERED_HITS.with(|h| h.get());
    let before = hits();
    for _ in 0..2 {
        assert_eq!(read_tar_gz_remembered(&a, LIMITS), fresh_a);
        assert_eq!(read_tar_gz_remembered(&b, LIMITS), fresh_b);
    }
    assert_eq!(
        hits(),
        before,
        "another archive each time: none from memory"
    );
    // The same archive twice in a row: the second from memory, the same result.
    assert_eq!(read_tar_gz_remembered(&a, LIMITS), fresh_a);
    assert_eq!(read_tar_gz_remembered(&a, LIMITS), fresh_a);
    assert_eq!(hits(), before + 1);
    assert_eq!(read_tar_gz_remembered(&b, LIMITS), fresh_b);
    // The same bytes under other limits are read again (here: refused).
    let one = Limits {
        max_unpacked: LIMITS.max_unpacked,
        max_members: 0,
    };
    assert_eq!(read_tar_gz_remembered(&a, one), read_tar_gz(&a, one));
    assert!(read_tar_gz(&a, one).is_err());
    // Junk is remembered as junk and the archive after it read afresh.
    assert!(read_tar_gz_remembered(b"junk", LIMITS).is_err());
    assert_eq!(read_tar_gz_remembered(&a, LIMITS), fresh_a);
}
