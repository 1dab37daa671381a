//! A strict reader of `.tar.gz` archives for verifiers: it accepts a subset of the formats on
//! which every reader agrees with GNU tar (GNU, ustar and PAX headers as GNU tar, python's
//! tarfile and perl's Archive::Tar write them) and refuses, instead of guessing, everything
//! that GNU tar would read another way or that only a lax reader would take as a clean end:
//!
//! - gzip: every member must be complete (trailer, CRC and length checked); members are
//!   concatenated as `gzip -d` does; anything after the last member is refused (garbage,
//!   zeros), as is an unpacked size past the limit (a bomb is a failure, not an end);
//! - headers: the checksum (unsigned sum) must match; the magic must be ustar (`ustar\0` `00`)
//!   or GNU (`ustar  \0`); numeric fields must be plain octal; a GNU long name (`L`) and a
//!   PAX `path` for the same member, two long names, two PAX headers, a PAX size that
//!   differs from the header's, a PAX keyword other than the plain ones (GNU sparse maps,
//!   `hdrcharset`, vendor keywords), global PAX headers, sparse, multi-volume, contiguous,
//!   dumpdir and volume headers are refused;
//! - members: directories, links and special files must carry no data (GNU tar reads a
//!   directory's data as headers); a regular member named with a trailing `/` (GNU tar makes
//!   it a directory), a name with `..` (GNU tar will not extract it), a name that is not UTF-8,
//!   a hard link to a member not earlier in the archive, a member under a non-directory
//!   member, and a name listed twice with different types or contents (GNU tar keeps the
//!   last) are refused;
//! - the end: the archive must end with a zero block and only zeros after it (GNU tar stops
//!   at the first zero block, `tar -i` reads on, so a member after it is ambiguous); a
//!   header or data cut short, or no end block at all, is a truncated archive; past
//!   [`Limits::max_members`] headers the archive is refused.
//!
//! Names are normalised as extraction would place them: leading `/` dropped, empty and `.`
//! components removed (`./srv//a.log` is `srv/a.log`).

use super::util::sha256_hex;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

/// Archives up to this size are remembered by [`read_tar_gz_remembered`].
const REMEMBERED_MAX: usize = 1 << 20;

/// What a read is remembered as: the archive's bytes, the limits and the result.
type Remembered = (Vec<u8>, Limits, Result<Vec<Member>, String>);

thread_local! {
    /// The last archive [`read_tar_gz_remembered`] read on this thread.
    static LAST: RefCell<Option<Remembered>> = const { RefCell::new(None) };
}

#[cfg(test)]
thread_local! {
    /// Reads answered from memory on this thread (for the tests).
    static REMEMBERED_HITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// How much an archive may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes after decompression.
    pub max_unpacked: u64,
    /// Headers (members and their long-name and PAX headers).
    pub max_members: usize,
}

/// What a member is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    /// A regular file: its size and the sha256 of its data.
    File {
        size: u64,
        sha256: String,
    },
    /// A hard link to an earlier member (normalised name), with that member's data's sha256.
    HardLink {
        target: String,
        sha256: String,
    },
    Symlink {
        target: String,
    },
    /// A character or block device or a FIFO (the type flag).
    Special(char),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Normalised (see the module's documentation); empty for the archive's root (`./`).
    pub name: String,
    /// As the archive spells it (after long names and PAX paths).
    pub raw_name: String,
    pub kind: Kind,
}

impl Member {
    /// The type letter `tar -tv` shows (`-`, `d`, `h`, `l`, `c`, `b`, `p`).
    pub fn type_char(&self) -> char {
        match &self.kind {
            Kind::Dir => 'd',
            Kind::File { .. } => '-',
            Kind::HardLink { .. } => 'h',
            Kind::Symlink { .. } => 'l',
            Kind::Special('3') => 'c',
            Kind::Special('4') => 'b',
            Kind::Special(_) => 'p',
        }
    }

    /// The size `tar -tv` shows (0 but for regular files).
    pub fn size(&self) -> u64 {
        match &self.kind {
            Kind::File { size, .. } => *size,
            _ => 0,
        }
    }
}

/// Decompress and read a `.tar.gz`, strictly (see the module's documentation).
pub fn read_tar_gz(gz: &[u8], limits: Limits) -> Result<Vec<Member>, String> {
    let tar = gunzip(gz, limits.max_unpacked)?;
    read_tar(&tar, limits.max_members)
}

/// [`read_tar_gz`], remembering the last archive read on this thread: a verifier reads the
/// same archive after every step, mostly unchanged. Only the very same bytes under the same
/// limits are answered from memory (compared whole, byte for byte), so the result is always
/// the one `read_tar_gz` gives; archives over 1 MiB are read afresh each time. Each thread
/// that reads keeps its last archive (at most 1 MiB) and result until it reads another or ends.
pub fn read_tar_gz_remembered(gz: &[u8], limits: Limits) -> Result<Vec<Member>, String> {
    if gz.len() > REMEMBERED_MAX {
        return read_tar_gz(gz, limits);
    }
    let known = LAST.with(|last| match &*last.borrow() {
        Some((bytes, l, read)) if bytes.as_slice() == gz && *l == limits => Some(read.clone()),
        _ => None,
    });
    if let Some(read) = known {
        #[cfg(test)]
        REMEMBERED_HITS.with(|h| h.set(h.get() + 1));
        return read;
    }
    let read = read_tar_gz(gz, limits);
    LAST.with(|last| *last.borrow_mut() = Some((gz.to_vec(), limits, read.clone())));
    read
}

/// Every gzip member of `gz`, concatenated, complete and checked; nothing after the last.
pub fn gunzip(gz: &[u8], max: u64) -> Result<Vec<u8>, String> {
    if gz.len() < 2 || gz[..2] != [0x1f, 0x8b] {
        return Err("not gzip data".into());
    }
    let mut rest: &[u8] = gz;
    let mut out = Vec::new();
    while !rest.is_empty() {
        if rest.len() < 2 || rest[..2] != [0x1f, 0x8b] {
            return Err(format!(
                "{} bytes of trailing data after the gzip stream",
                rest.len()
            ));
        }
        let budget = max.saturating_sub(out.len() as u64);
        let mut d = flate2::bufread::GzDecoder::new(&mut rest).take(budget + 1);
        d.read_to_end(&mut out)
            .map_err(|e| format!("gzip: {e} (corrupt or truncated)"))?;
        if out.len() as u64 > max {
            return Err(format!(
                "more than {max} bytes once unpacked (limit reached)"
            ));
        }
    }
    Ok(out)
}

const BLOCK: usize = 512;

/// A numeric header field: optional leading spaces, octal digits, then only NULs and spaces.
/// Base-256 and anything else GNU tar would have to guess at are refused.
fn octal(field: &[u8], what: &str) -> Result<u64, String> {
    let bad = || format!("bad {what} field {:?}", String::from_utf8_lossy(field));
    let mut i = 0;
    while i < field.len() && field[i] == b' ' {
        i += 1;
    }
    let mut v: u64 = 0;
    while i < field.len() && (b'0'..=b'7').contains(&field[i]) {
        v = v
            .checked_mul(8)
            .and_then(|v| v.checked_add(u64::from(field[i] - b'0')))
            .ok_or_else(bad)?;
        i += 1;
    }
    if field[i..].iter().any(|&b| b != 0 && b != b' ') {
        return Err(bad());
    }
    Ok(v)
}

/// A NUL-terminated field (or the whole field when it has no NUL).
fn cstr(field: &[u8]) -> &[u8] {
    field.split(|&b| b == 0).next().unwrap_or(&[])
}

fn utf8(b: &[u8], what: &str) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
}

/// Data of a long-name member: the name, then NULs only.
fn long_name(data: &[u8]) -> Result<String, String> {
    let name = cstr(data);
    if data[name.len()..].iter().any(|&b| b != 0) {
        return Err("a GNU long name with data after its NUL".into());
    }
    if name.is_empty() {
        return Err("an empty GNU long name".into());
    }
    utf8(name, "a GNU long name")
}

/// The keywords of a PAX extended header, strictly: `LEN key=value\n` records, LEN counting
/// the whole record, no keyword twice, only the keywords every reader treats alike.
fn pax_records(data: &[u8]) -> Result<BTreeMap<String, String>, String> {
    const ALLOWED: &[&str] = &[
        "path", "linkpath", "size", "mtime", "atime", "ctime", "uid", "gid", "uname", "gname",
    ];
    let mut out = BTreeMap::new();
    let mut rest = data;
    // Writers pad the header's data with NULs to its block; the size field covers only the
    // records, so anything left is an error.
    while !rest.is_empty() {
        let sp = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or("a PAX record without a length")?;
        let len_txt = std::str::from_utf8(&rest[..sp]).map_err(|_| "a bad PAX record length")?;
        if len_txt.is_empty() || !len_txt.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("a bad PAX record length {len_txt:?}"));
        }
        let len: usize = len_txt.parse().map_err(|_| "a bad PAX record length")?;
        if len <= sp + 1 || len > rest.len() || rest[len - 1] != b'\n' {
            return Err("a PAX record whose length does not match".into());
        }
        let rec = &rest[sp + 1..len - 1];
        let eq = rec
            .iter()
            .position(|&b| b == b'=')
            .ok_or("a PAX record without `=`")?;
        let key = utf8(&rec[..eq], "a PAX keyword")?;
        let value = utf8(&rec[eq + 1..], "a PAX value")?;
        if !ALLOWED.contains(&key.as_str()) {
            return Err(format!(
                "PAX keyword {key:?} (not read alike by every reader)"
            ));
        }
        if value.is_empty() || value.contains('\0') {
            return Err(format!("an empty or NUL-holding PAX {key}"));
        }
        let numeric = |v: &str| {
            let v = v.strip_prefix('-').unwrap_or(v);
            let (i, f) = v.split_once('.').unwrap_or((v, "0"));
            !i.is_empty()
                && !f.is_empty()
                && i.bytes().all(|b| b.is_ascii_digit())
                && f.bytes().all(|b| b.is_ascii_digit())
        };
        let ok = match key.as_str() {
            "size" | "uid" | "gid" => value.bytes().all(|b| b.is_ascii_digit()),
            "mtime" | "atime" | "ctime" => numeric(&value),
            _ => true,
        };
        if !ok {
            return Err(format!("a bad PAX {key} {value:?}"));
        }
        if out.insert(key.clone(), value).is_some() {
            return Err(format!("PAX keyword {key} given twice"));
        }
        rest = &rest[len..];
    }
    Ok(out)
}

/// A member name as extraction places it: leading `/` dropped, empty and `.` components
/// removed; `..` is refused. Returns the name and whether it ended in `/`.
fn normalise(raw: &str) -> Result<(String, bool), String> {
    let mut parts = Vec::new();
    for c in raw.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(format!("member {raw:?} has a `..` component")),
            c => parts.push(c),
        }
    }
    Ok((parts.join("/"), raw.ends_with('/')))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Magic {
    Ustar,
    Gnu,
}

/// Read an uncompressed tar stream, strictly (see the module's documentation).
pub fn read_tar(tar: &[u8], max_members: usize) -> Result<Vec<Member>, String> {
    let mut out: Vec<Member> = Vec::new();
    let mut pos = 0usize;
    let mut headers = 0usize;
    let mut long_path: Option<String> = None;
    let mut long_link: Option<String> = None;
    let mut pax: Option<BTreeMap<String, String>> = None;
    loop {
        if pos + BLOCK > tar.len() {
            return Err(if pos == tar.len() {
                "no end-of-archive block (truncated archive)".into()
            } else {
                "a header cut short (truncated archive)".into()
            });
        }
        let h = &tar[pos..pos + BLOCK];
        let at = pos;
        pos += BLOCK;
        if h.iter().all(|&b| b == 0) {
            if long_path.is_some() || long_link.is_some() || pax.is_some() {
                return Err("a long name or PAX header with no member after it".into());
            }
            if tar[pos..].iter().any(|&b| b != 0) {
                return Err(format!(
                    "data after the end-of-archive block at offset {at} (GNU tar stops there, \
                     tar -i reads on)"
                ));
            }
            break;
        }
        headers += 1;
        if headers > max_members {
            return Err(format!("more than {max_members} headers (limit reached)"));
        }
        // The checksum: the unsigned sum of the header with its checksum field as spaces.
        let want = octal(&h[148..156], "checksum")?;
        let sum: u64 = h
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(b)
                }
            })
            .sum();
        if sum != want {
            return Err(format!("header checksum mismatch at offset {at}"));
        }
        let magic = match (&h[257..263], &h[263..265]) {
            (b"ustar\0", b"00") => Magic::Ustar,
            (b"ustar ", b" \0") => Magic::Gnu,
            _ => {
                return Err(format!(
                    "a header at offset {at} that is neither ustar nor GNU (v7 or unknown)"
                ))
            }
        };
        for (r, what) in [
            (100..108, "mode"),
            (108..116, "uid"),
            (116..124, "gid"),
            (136..148, "mtime"),
        ] {
            octal(&h[r], what)?;
        }
        let header_size = octal(&h[124..136], "size")?;
        let typeflag = h[156];
        // The data of meta headers (long names, PAX) is read here; a member's size may be
        // overridden by its PAX header.
        let data_at = |size: u64| -> Result<&[u8], String> {
            let size = usize::try_from(size).map_err(|_| "a size too large".to_string())?;
            let end = pos
                .checked_add(size)
                .filter(|&e| e <= tar.len())
                .ok_or_else(|| format!("member data cut short at offset {at} (truncated)"))?;
            Ok(&tar[pos..end])
        };
        let padded = |size: u64| -> usize { (size as usize).div_ceil(BLOCK) * BLOCK };
        match typeflag {
            b'L' | b'K' | b'x' => {
                if header_size > 1 << 20 {
                    return Err("a long name or PAX header over 1 MiB".into());
                }
                let data = data_at(header_size)?;
                match typeflag {
                    b'L' if long_path.is_some() => {
                        return Err("two GNU long names for one member".into())
                    }
                    b'L' => long_path = Some(long_name(data)?),
                    b'K' if long_link.is_some() => {
                        return Err("two GNU long link names for one member".into())
                    }
                    b'K' => long_link = Some(long_name(data)?),
                    _ if pax.is_some() => return Err("two PAX headers for one member".into()),
                    _ => pax = Some(pax_records(data)?),
                }
                pos += padded(header_size);
                continue;
            }
            b'0' | b'\0' | b'1' | b'2' | b'3' | b'4' | b'5' | b'6' => {}
            b'g' => return Err("a global PAX header (applies to every later member)".into()),
            b'S' => return Err("a GNU sparse member".into()),
            t => {
                return Err(format!(
                    "member type {:?} at offset {at} (not a plain file, directory or link)",
                    t as char
                ))
            }
        }
        let p = pax.take().unwrap_or_default();
        let lp = long_path.take();
        let ll = long_link.take();
        let raw_name = match (lp, p.get("path")) {
            (Some(_), Some(_)) => return Err(
                "a member with both a GNU long name and a PAX path (GNU tar obeys the PAX path)"
                    .into(),
            ),
            (Some(l), None) => l,
            (None, Some(x)) => x.clone(),
            (None, None) => {
                let name = cstr(&h[0..100]);
                let prefix = if magic == Magic::Ustar {
                    cstr(&h[345..500])
                } else {
                    &[][..]
                };
                let mut full = Vec::new();
                if !prefix.is_empty() {
                    full.extend_from_slice(prefix);
                    full.push(b'/');
                }
                full.extend_from_slice(name);
                utf8(&full, "a member name")?
            }
        };
        let link_raw = match (ll, p.get("linkpath")) {
            (Some(_), Some(_)) => {
                return Err("a member with both a GNU long link name and a PAX linkpath".into())
            }
            (Some(l), None) => l,
            (None, Some(x)) => x.clone(),
            (None, None) => utf8(cstr(&h[157..257]), "a link name")?,
        };
        let size = match p.get("size") {
            Some(s) => {
                let s: u64 = s.parse().map_err(|_| "a bad PAX size")?;
                if s != header_size {
                    return Err(format!(
                        "member {raw_name:?}: its PAX size {s} differs from its header's \
                         {header_size}"
                    ));
                }
                s
            }
            None => header_size,
        };
        if raw_name.is_empty() {
            return Err(format!("a member at offset {at} without a name"));
        }
        let (name, slash) = normalise(&raw_name)?;
        let data = data_at(size)?;
        pos += padded(size);
        if typeflag != b'0' && typeflag != b'\0' && size != 0 {
            return Err(format!(
                "member {raw_name:?} of type {:?} carries {size} bytes of data (GNU tar reads a \
                 directory's data as headers)",
                typeflag as char
            ));
        }
        if typeflag != b'5' && slash {
            return Err(format!(
                "member {raw_name:?} ends in `/` but is not a directory (GNU tar makes it one)"
            ));
        }
        if typeflag != b'5' && name.is_empty() {
            return Err(format!("member {raw_name:?} has an empty name"));
        }
        let kind = match typeflag {
            b'5' => Kind::Dir,
            b'0' | b'\0' => Kind::File {
                size,
                sha256: sha256_hex(data),
            },
            b'1' => {
                let (target, _) = normalise(&link_raw)?;
                let sha = out
                    .iter()
                    .rev()
                    .find(|m| m.name == target)
                    .and_then(|m| match &m.kind {
                        Kind::File { sha256, .. } | Kind::HardLink { sha256, .. } => {
                            Some(sha256.clone())
                        }
                        _ => None,
                    })
                    .ok_or_else(|| {
                        format!(
                            "member {raw_name:?} is a hard link to {link_raw:?}, not a file \
                             earlier in the archive"
                        )
                    })?;
                Kind::HardLink {
                    target,
                    sha256: sha,
                }
            }
            b'2' => Kind::Symlink { target: link_raw },
            t => Kind::Special(t as char),
        };
        out.push(Member {
            name,
            raw_name,
            kind,
        });
    }
    check_names(&out)?;
    Ok(out)
}

/// No name twice with different meanings, and nothing under a member that is not a
/// directory.
fn check_names(members: &[Member]) -> Result<(), String> {
    let mut first: BTreeMap<&str, &Member> = BTreeMap::new();
    for m in members {
        if let Some(prev) = first.get(m.name.as_str()) {
            let same = match (&prev.kind, &m.kind) {
                (Kind::Dir, Kind::Dir) => true,
                (Kind::File { sha256: a, .. }, Kind::File { sha256: b, .. }) => a == b,
                (Kind::File { .. } | Kind::HardLink { .. }, Kind::HardLink { target, .. }) => {
                    *target == m.name
                }
                _ => false,
            };
            if !same {
                return Err(format!(
                    "member {:?} is listed twice with different types or contents (GNU tar \
                     keeps the last)",
                    m.name
                ));
            }
        } else {
            first.insert(&m.name, m);
        }
    }
    let non_dirs: BTreeSet<&str> = members
        .iter()
        .filter(|m| m.kind != Kind::Dir)
        .map(|m| m.name.as_str())
        .collect();
    for m in members {
        let mut p = m.name.as_str();
        while let Some((parent, _)) = p.rsplit_once('/') {
            if non_dirs.contains(parent) {
                return Err(format!(
                    "member {:?} lies under {parent:?}, which is not a directory",
                    m.name
                ));
            }
            p = parent;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
