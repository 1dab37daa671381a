//! Image sources: where the image's files are read from. A layout directory is
//! read with the same no-follow walk as the extractor; a (gzip) tar archive is
//! indexed once by member path and its members are read in place with `pread`.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::digest::Sha256Digest;
use super::layer::{stream_cap, unique_suffix};
use super::paths::{cstring, join, normalize, open_dir_path, walk};
use super::{io_err, ImportLimits, OciError, MAX_DEPTH, MAX_JSON_BYTES};

/// Where the image's files live.
pub(super) enum Source {
    /// A directory (OCI layout, or an unpacked `docker save`).
    Dir { path: PathBuf, root: OwnedFd },
    /// A tar archive, indexed by member path; data read with `pread`.
    Tar {
        path: PathBuf,
        file: File,
        members: HashMap<String, Member>,
    },
}

#[derive(Debug, Clone)]
pub(super) enum Member {
    Data {
        offset: u64,
        size: u64,
    },
    /// Symlink or hard link to another member (archive-rooted, normalised).
    Link(Option<String>),
}

impl Source {
    pub(super) fn open(path: &Path, store: &Path, limits: &ImportLimits) -> Result<Self, OciError> {
        let meta = std::fs::metadata(path).map_err(io_err(path, "stat image source"))?;
        if meta.is_dir() {
            let root = open_dir_path(path, true).map_err(io_err(path, "open image directory"))?;
            return Ok(Source::Dir {
                path: path.to_path_buf(),
                root,
            });
        }
        if !meta.is_file() {
            return Err(OciError::UnrecognizedSource {
                path: path.to_path_buf(),
                reason: "neither a directory nor a regular file".into(),
            });
        }
        let mut file = File::open(path).map_err(io_err(path, "open image archive"))?;
        let mut magic = [0u8; 4];
        let n = read_up_to(&mut file, &mut magic).map_err(io_err(path, "read image archive"))?;
        let file = match &magic[..n] {
            [0x1f, 0x8b, ..] => gunzip_to_temp(path, file, store, limits)?,
            [0x28, 0xb5, 0x2f, 0xfd] => {
                return Err(OciError::UnrecognizedSource {
                    path: path.to_path_buf(),
                    reason: "zstd-compressed archives are not supported".into(),
                })
            }
            _ => file,
        };
        let members = index_tar(path, &file, limits)?;
        Ok(Source::Tar {
            path: path.to_path_buf(),
            file,
            members,
        })
    }

    pub(super) fn exists(&self, rel: &str) -> bool {
        matches!(self.open_member(rel), Ok(Some(_)))
    }

    /// Opens `rel` (slash-separated, relative to the image root). `Ok(None)`
    /// when absent.
    pub(super) fn open_member(&self, rel: &str) -> Result<Option<Box<dyn Read + '_>>, OciError> {
        let comps = match normalize(rel.as_bytes()) {
            Ok(c) if !c.is_empty() => c,
            _ => return Ok(None),
        };
        match self {
            Source::Dir { path, root } => {
                let (name, parents) = match comps.split_last() {
                    Some(x) => x,
                    None => return Ok(None),
                };
                let parent = match walk(root.as_fd(), parents, None) {
                    Ok(fd) => fd,
                    Err(_) => return Ok(None),
                };
                let cname = match cstring(name) {
                    Ok(c) => c,
                    Err(_) => return Ok(None),
                };
                let fd = match crate::sys::openat(
                    parent.as_fd(),
                    &cname,
                    // O_NONBLOCK: a FIFO planted as a blob must not hang us.
                    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                    Mode::empty(),
                ) {
                    Ok(fd) => fd,
                    Err(e) if is_absent(&e) => return Ok(None),
                    Err(e) => return Err(io_err(&path.join(rel), "open blob")(e)),
                };
                let file = File::from(fd);
                let meta = file
                    .metadata()
                    .map_err(io_err(&path.join(rel), "stat blob"))?;
                if !meta.is_file() {
                    return Ok(None);
                }
                Ok(Some(Box::new(file)))
            }
            Source::Tar { file, members, .. } => {
                let mut key = join(&comps);
                for _ in 0..MAX_DEPTH {
                    match members.get(&key) {
                        None | Some(Member::Link(None)) => return Ok(None),
                        Some(Member::Link(Some(target))) => key = target.clone(),
                        Some(Member::Data { offset, size }) => {
                            let r = SectionReader {
                                file,
                                pos: *offset,
                                end: offset.saturating_add(*size),
                            };
                            return Ok(Some(Box::new(r)));
                        }
                    }
                }
                Ok(None)
            }
        }
    }

    fn label(&self) -> &Path {
        match self {
            Source::Dir { path, .. } | Source::Tar { path, .. } => path,
        }
    }

    /// Reads a JSON member, verifying its digest (and size) when given.
    pub(super) fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        rel: &str,
        blob: &str,
        expected: Option<(&Sha256Digest, Option<u64>)>,
    ) -> Result<T, OciError> {
        let reader = self
            .open_member(rel)?
            .ok_or_else(|| OciError::MissingBlob {
                blob: blob.to_string(),
            })?;
        let mut buf = Vec::new();
        reader
            .take(MAX_JSON_BYTES + 1)
            .read_to_end(&mut buf)
            .map_err(io_err(&self.label().join(rel), "read blob"))?;
        if buf.len() as u64 > MAX_JSON_BYTES {
            return Err(OciError::LimitExceeded {
                blob: blob.to_string(),
                entry: rel.to_string(),
                reason: format!("JSON document larger than {MAX_JSON_BYTES} bytes"),
            });
        }
        if let Some((digest, size)) = expected {
            let actual = Sha256Digest::of(&buf);
            if &actual != digest {
                return Err(OciError::DigestMismatch {
                    blob: blob.to_string(),
                    expected: digest.display(),
                    actual: actual.display(),
                });
            }
            if let Some(size) = size {
                if size != buf.len() as u64 {
                    return Err(OciError::SizeMismatch {
                        blob: blob.to_string(),
                        expected: size,
                        actual: buf.len() as u64,
                    });
                }
            }
        }
        serde_json::from_slice(&buf).map_err(|e| OciError::InvalidImage {
            blob: blob.to_string(),
            reason: e.to_string(),
        })
    }
}

fn is_absent(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP)
    )
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Decompresses a gzip-compressed outer archive into an unlinked temp file in
/// the store (so members can be read at random offsets).
fn gunzip_to_temp(
    path: &Path,
    mut file: File,
    store: &Path,
    limits: &ImportLimits,
) -> Result<File, OciError> {
    use std::io::Seek;
    file.seek(io::SeekFrom::Start(0))
        .map_err(io_err(path, "rewind image archive"))?;
    let tmp_path = store.join(format!(".tmp-src-{}", unique_suffix()));
    let mut out = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&tmp_path)
        .map_err(io_err(&tmp_path, "create temp file"))?;
    // Unlink at once: the open handle keeps the data, nothing is left behind.
    std::fs::remove_file(&tmp_path).map_err(io_err(&tmp_path, "unlink temp file"))?;
    let cap = stream_cap(limits, 0);
    let mut dec =
        flate2::read::MultiGzDecoder::new(BufReader::new(file)).take(cap.saturating_add(1));
    let n = io::copy(&mut dec, &mut out).map_err(|e| OciError::UnrecognizedSource {
        path: path.to_path_buf(),
        reason: format!("corrupt gzip stream: {e}"),
    })?;
    if n > cap {
        return Err(OciError::LimitExceeded {
            blob: path.display().to_string(),
            entry: String::new(),
            reason: format!("decompressed archive larger than {cap} bytes"),
        });
    }
    Ok(out)
}

/// Indexes the members of an outer tar archive.
fn index_tar(
    path: &Path,
    file: &File,
    limits: &ImportLimits,
) -> Result<HashMap<String, Member>, OciError> {
    let bad = |reason: String| OciError::UnrecognizedSource {
        path: path.to_path_buf(),
        reason,
    };
    let len = file.metadata().map_err(io_err(path, "stat archive"))?.len();
    let mut reader = SectionReader {
        file,
        pos: 0,
        end: len,
    };
    let mut archive = tar::Archive::new(&mut reader);
    let mut members = HashMap::new();
    let entries = archive
        .entries_with_seek()
        .map_err(|e| bad(format!("not a tar archive: {e}")))?;
    let mut count = 0u64;
    for entry in entries {
        let entry = entry.map_err(|e| bad(format!("not a valid tar archive: {e}")))?;
        count += 1;
        if count > limits.max_entries {
            return Err(OciError::LimitExceeded {
                blob: path.display().to_string(),
                entry: String::from_utf8_lossy(&entry.path_bytes()).into_owned(),
                reason: format!("archive has more than {} entries", limits.max_entries),
            });
        }
        let raw = entry.path_bytes().into_owned();
        let Ok(comps) = normalize(&raw) else { continue };
        if comps.is_empty() {
            continue;
        }
        let key = join(&comps);
        let kind = entry.header().entry_type();
        let member = if kind.is_file() || kind == tar::EntryType::Continuous {
            Member::Data {
                offset: entry.raw_file_position(),
                size: entry.size(),
            }
        } else if kind.is_symlink() || kind.is_hard_link() {
            let target = entry.link_name_bytes().map(|t| t.into_owned());
            let resolved = target.and_then(|t| {
                let full = if kind.is_symlink() && !t.starts_with(b"/") {
                    let mut base = comps[..comps.len() - 1].join(&b'/');
                    base.push(b'/');
                    base.extend_from_slice(&t);
                    base
                } else {
                    t
                };
                normalize(&full).ok().map(|c| join(&c))
            });
            Member::Link(resolved)
        } else {
            continue;
        };
        members.insert(key, member);
    }
    if members.is_empty() {
        return Err(bad("not a tar archive, or an empty one".into()));
    }
    Ok(members)
}

/// Reads `[pos, end)` of a file with `pread`, never moving a shared offset.
struct SectionReader<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

/// Seeking lets the archive index skip member data instead of reading it.
impl io::Seek for SectionReader<'_> {
    fn seek(&mut self, pos: io::SeekFrom) -> io::Result<u64> {
        let new = match pos {
            io::SeekFrom::Start(n) => Some(n),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
            io::SeekFrom::End(d) => self.end.checked_add_signed(d),
        };
        self.pos = new.ok_or_else(|| io::Error::other("seek out of range"))?;
        Ok(self.pos)
    }
}

impl Read for SectionReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end.saturating_sub(self.pos);
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}
