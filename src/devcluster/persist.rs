//! `--data-dir`: the server's objects and resourceVersion survive a restart.
//!
//! The state is one file, `<data-dir>/state.json`: a header line
//! `agentrt-dev-state v1 sha256:<hex of the body>` and a JSON body
//! `{"resourceVersion": "N", "objects": [{"storage", "namespace", "name", "object"}]}`. It is
//! written atomically (temporary file, fsync, rename, fsync of the directory) shortly after
//! each change (debounced) and at shutdown. At start a torn or corrupt file (bad header,
//! checksum mismatch, undecodable body) is refused with an error naming it, never emptied. A
//! `lock` file held with `flock` keeps two servers off one directory. Watch history is not
//! persisted: after a restart, watches from an older resourceVersion get 410 and re-list.
//!
//! The snapshot trails the writes, so every change is also appended, before the request that
//! made it is answered, to `<data-dir>/journal` (one JSON line per change:
//! `{"rv", "storage", "namespace", "name", "object"}`, `object` null for a deletion). A write
//! that returned is in the kernel's page cache, so a kill -9 of the server loses nothing it
//! answered (a power loss may: there is no fsync per change). When a snapshot is taken the
//! journal is set aside as `journal-<rv>` and a new one begun; once the snapshot is on disk the
//! set-aside journals it covers are deleted. At start the snapshot is read, then every journal
//! in order, applying the changes above the snapshot's resourceVersion; a last line cut short
//! by a crash was never answered and is skipped, any other bad line is refused as corrupt.
//!
//! The snapshot cannot say
//! which resourceVersions were handed out. `<data-dir>/resource-version` can: a line
//! `agentrt-dev-rv v1 <N>` promising that no resourceVersion above N was handed out, written
//! (atomically, fsynced) before the server hands out one above the previous promise. A
//! restarted server starts above both it and the snapshot, so the sequence never goes back or
//! reuses a number, and every watch from before the restart is older than its history (410),
//! as kube-apiserver answers after a compaction.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::error::DevClusterError;
use super::store::ObjKey;

const HEADER: &str = "agentrt-dev-state v1 sha256:";
/// File name of the state file inside the data directory.
pub const STATE_FILE: &str = "state.json";
/// File name of the resourceVersion reservation inside the data directory.
pub const RV_FILE: &str = "resource-version";
const RV_HEADER: &str = "agentrt-dev-rv v1 ";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> DevClusterError + '_ {
    move |source| DevClusterError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `bytes` to `path` atomically with permissions `mode`, creating the parent
/// directory.
///
/// # Errors
/// [`DevClusterError::Io`] naming the path.
pub fn write_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), DevClusterError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(io(&dir))?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "file".to_string());
    let tmp = dir.join(format!(".{file_name}.tmp.{}", std::process::id()));
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io(&tmp))?;
        f.write_all(bytes).map_err(io(&tmp))?;
        f.sync_all().map_err(io(&tmp))?;
    }
    fs::rename(&tmp, path).map_err(io(path))?;
    if let Ok(d) = File::open(&dir) {
        // Make the rename durable; a failure here loses nothing already written.
        let _ = d.sync_all();
    }
    Ok(())
}

/// Holds the data directory's lock for as long as it lives.
pub struct DirLock {
    _file: File,
}

/// Takes the data directory (creating it) and its lock.
///
/// # Errors
/// [`DevClusterError::DataDirLocked`] when another server holds it; [`DevClusterError::Io`].
pub fn lock(dir: &Path) -> Result<DirLock, DevClusterError> {
    fs::create_dir_all(dir).map_err(io(dir))?;
    let path = dir.join("lock");
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io(&path))?;
    // SAFETY: flock on a file descriptor we own and keep open; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(DevClusterError::DataDirLocked(dir.to_path_buf()));
    }
    Ok(DirLock { _file: file })
}

/// A loaded state: the resourceVersion and every object with its key.
pub type Snapshot = (u64, Vec<(ObjKey, Value)>);

#[derive(Serialize)]
struct Entry<'a> {
    storage: &'a str,
    namespace: &'a str,
    name: &'a str,
    object: &'a Value,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Body<'a> {
    resource_version: String,
    objects: Vec<Entry<'a>>,
}

/// Writes the state (resourceVersion `rv` and every object) to `<dir>/state.json`.
///
/// # Errors
/// [`DevClusterError::Io`] naming the file.
pub fn save(dir: &Path, rv: u64, objects: &[(ObjKey, Arc<Value>)]) -> Result<(), DevClusterError> {
    let body = Body {
        resource_version: rv.to_string(),
        objects: objects
            .iter()
            .map(|(k, v)| Entry {
                storage: &k.storage,
                namespace: &k.namespace,
                name: &k.name,
                object: v,
            })
            .collect(),
    };
    let path = dir.join(STATE_FILE);
    let json = serde_json::to_vec(&body).map_err(|e| DevClusterError::Io {
        path: path.clone(),
        source: std::io::Error::other(e),
    })?;
    let mut bytes = format!("{HEADER}{}\n", hex::encode(Sha256::digest(&json))).into_bytes();
    bytes.extend_from_slice(&json);
    write_atomically(&path, &bytes, 0o600)
}

/// Reads `<dir>/state.json`: `None` when there is none yet, else the resourceVersion and the
/// objects.
///
/// # Errors
/// [`DevClusterError::CorruptState`] for a torn or corrupt file; [`DevClusterError::Io`].
pub fn load(dir: &Path) -> Result<Option<Snapshot>, DevClusterError> {
    let path = dir.join(STATE_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    let corrupt = |reason: &str| DevClusterError::CorruptState {
        path: path.clone(),
        reason: reason.to_string(),
    };
    let newline = bytes
        .iter()
        .position(|b| *b == b'\n')
        .ok_or_else(|| corrupt("no header line"))?;
    let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| corrupt("bad header"))?;
    let want = header
        .strip_prefix(HEADER)
        .ok_or_else(|| corrupt("not an agentrt dev state file"))?;
    let body = &bytes[newline + 1..];
    if hex::encode(Sha256::digest(body)) != want {
        return Err(corrupt("checksum mismatch: the file is torn or was edited"));
    }
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| corrupt(&format!("undecodable body: {e}")))?;
    let rv = doc["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| corrupt("missing resourceVersion"))?;
    let mut objects = Vec::new();
    for entry in doc["objects"]
        .as_array()
        .ok_or_else(|| corrupt("missing objects"))?
    {
        let (Some(storage), Some(namespace), Some(name)) = (
            entry["storage"].as_str(),
            entry["namespace"].as_str(),
            entry["name"].as_str(),
        ) else {
            return Err(corrupt("an object entry lacks storage, namespace or name"));
        };
        if !entry["object"].is_object() {
            return Err(corrupt("an object entry is not an object"));
        }
        objects.push((
            ObjKey {
                storage: Arc::from(storage),
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            entry["object"].clone(),
        ));
    }
    Ok(Some((rv, objects)))
}

/// Promises, durably, that no resourceVersion above `ceiling` will be handed out until a
/// larger one is reserved: writes `<dir>/resource-version`.
///
/// # Errors
/// [`DevClusterError::Io`] naming the file.
pub fn reserve(dir: &Path, ceiling: u64) -> Result<(), DevClusterError> {
    write_atomically(
        &dir.join(RV_FILE),
        format!("{RV_HEADER}{ceiling}\n").as_bytes(),
        0o600,
    )
}

/// The last reserved ceiling (see [`reserve`]): `None` when there is no reservation yet (a new
/// directory, or one written before reservations existed).
///
/// # Errors
/// [`DevClusterError::CorruptState`] for an unreadable reservation; [`DevClusterError::Io`].
pub fn reserved(dir: &Path) -> Result<Option<u64>, DevClusterError> {
    let path = dir.join(RV_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path)(e)),
    };
    text.trim_end()
        .strip_prefix(RV_HEADER)
        .and_then(|n| n.parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| DevClusterError::CorruptState {
            path,
            reason: "not an agentrt dev resourceVersion reservation".into(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(name: &str) -> ObjKey {
        ObjKey {
            storage: Arc::from("configmaps"),
            namespace: "default".into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_journal_replays_changes_after_the_snapshot_and_skips_a_cut_last_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut journal = Journal::open(dir.path()).expect("open");
        journal
            .append(5, &key("old"), Some(&json!({"v": 0})))
            .expect("append");
        journal.rotate(5).expect("rotate");
        journal
            .append(6, &key("a"), Some(&json!({"v": 1})))
            .expect("append");
        journal
            .append(7, &key("a"), Some(&json!({"v": 2})))
            .expect("append");
        journal
            .append(8, &key("b"), Some(&json!({"v": 3})))
            .expect("append");
        journal.append(9, &key("b"), None).expect("append");
        drop(journal);
        // A crash cut the last write short: it was never answered.
        let mut file = OpenOptions::new()
            .append(true)
            .open(dir.path().join(JOURNAL_FILE))
            .expect("open");
        file.write_all(br#"{"rv":10,"storage":"configm"#)
            .expect("write");
        let mut objects = vec![(key("old"), json!({"v": 0}))];
        let highest = replay(dir.path(), 5, &mut objects).expect("replays");
        assert_eq!(highest, 9);
        assert_eq!(
            objects,
            vec![(key("a"), json!({"v": 2})), (key("old"), json!({"v": 0}))]
        );
        drop_journals_up_to(dir.path(), 5).expect("drop");
        assert!(!dir.path().join("journal-5").exists());
    }

    #[test]
    fn a_bad_line_inside_the_journal_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::write(
            dir.path().join(JOURNAL_FILE),
            "not json\n{\"rv\":2,\"storage\":\"s\",\"namespace\":\"\",\"name\":\"n\",\"object\":null}\n",
        )
        .expect("write");
        let mut objects = Vec::new();
        assert!(matches!(
            replay(dir.path(), 0, &mut objects),
            Err(DevClusterError::CorruptState { .. })
        ));
    }

    #[test]
    fn state_round_trips_and_a_flipped_byte_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = ObjKey {
            storage: Arc::from("configmaps"),
            namespace: "default".into(),
            name: "a".into(),
        };
        save(
            dir.path(),
            42,
            &[(key.clone(), Arc::new(json!({"data": {"x": "1"}})))],
        )
        .expect("save");
        let Ok(Some((rv, objects))) = load(dir.path()) else {
            panic!("load");
        };
        assert_eq!(rv, 42);
        assert_eq!(objects, vec![(key, json!({"data": {"x": "1"}}))]);

        let path = dir.path().join(STATE_FILE);
        let mut bytes = fs::read(&path).expect("read");
        let last = bytes.len() - 3;
        bytes[last] ^= 1;
        fs::write(&path, bytes).expect("write");
        match load(dir.path()) {
            Err(DevClusterError::CorruptState { path: p, .. }) => assert_eq!(p, path),
            other => panic!("expected corrupt state, got {other:?}"),
        }
    }

    #[test]
    fn a_reservation_round_trips_and_a_bad_one_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(reserved(dir.path()), Ok(None)));
        reserve(dir.path(), 1_700_000_010_000).expect("reserve");
        assert!(matches!(reserved(dir.path()), Ok(Some(1_700_000_010_000))));
        fs::write(dir.path().join(RV_FILE), "12").expect("write");
        assert!(matches!(
            reserved(dir.path()),
            Err(DevClusterError::CorruptState { .. })
        ));
    }

    #[test]
    fn a_missing_state_file_means_a_fresh_cluster() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(load(dir.path()), Ok(None)));
    }

    #[test]
    fn a_second_server_cannot_take_the_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let _held = lock(dir.path()).expect("first lock");
        assert!(matches!(
            lock(dir.path()),
            Err(DevClusterError::DataDirLocked(_))
        ));
    }
}

/// File name of the journal being appended to, inside the data directory.
pub const JOURNAL_FILE: &str = "journal";

#[derive(Serialize)]
struct JournalLine<'a> {
    rv: u64,
    storage: &'a str,
    namespace: &'a str,
    name: &'a str,
    object: Option<&'a Value>,
}

/// The change journal of a data directory (see the module doc).
pub struct Journal {
    dir: PathBuf,
    file: File,
}

impl Journal {
    /// Opens (creating) `<dir>/journal` for appending.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] naming the file.
    pub fn open(dir: &Path) -> Result<Journal, DevClusterError> {
        let path = dir.join(JOURNAL_FILE);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .map_err(io(&path))?;
        Ok(Journal {
            dir: dir.to_path_buf(),
            file,
        })
    }

    /// Appends one change: `object` is the stored object, `None` for a deletion. One
    /// `write` of the whole line, so a crash leaves at most a cut last line.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] naming the journal.
    pub fn append(
        &mut self,
        rv: u64,
        key: &ObjKey,
        object: Option<&Value>,
    ) -> Result<(), DevClusterError> {
        let path = self.dir.join(JOURNAL_FILE);
        let line = JournalLine {
            rv,
            storage: &key.storage,
            namespace: &key.namespace,
            name: &key.name,
            object,
        };
        let mut bytes =
            serde_json::to_vec(&line).map_err(|e| io(&path)(std::io::Error::other(e)))?;
        bytes.push(b'\n');
        self.file.write_all(&bytes).map_err(io(&path))
    }

    /// Sets the journal aside as `journal-<rv>` (the changes up to the snapshot being taken
    /// at `rv`) and begins a new one.
    ///
    /// # Errors
    /// [`DevClusterError::Io`] naming the file.
    pub fn rotate(&mut self, rv: u64) -> Result<(), DevClusterError> {
        let current = self.dir.join(JOURNAL_FILE);
        let aside = self.dir.join(format!("{JOURNAL_FILE}-{rv}"));
        fs::rename(&current, &aside).map_err(io(&current))?;
        *self = Journal::open(&self.dir)?;
        Ok(())
    }
}

/// Deletes the set-aside journals a snapshot at `rv` covers (`journal-<n>` with n <= rv).
///
/// # Errors
/// [`DevClusterError::Io`] naming the directory or file.
pub fn drop_journals_up_to(dir: &Path, rv: u64) -> Result<(), DevClusterError> {
    for (n, path) in set_aside_journals(dir)? {
        if n <= rv {
            fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    Ok(())
}

fn set_aside_journals(dir: &Path) -> Result<Vec<(u64, PathBuf)>, DevClusterError> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if let Some(n) = name
            .strip_prefix(&format!("{JOURNAL_FILE}-"))
            .and_then(|n| n.parse::<u64>().ok())
        {
            found.push((n, entry.path()));
        }
    }
    found.sort();
    Ok(found)
}

/// Applies every journaled change above `snapshot_rv` to `objects` (set-aside journals in
/// order, then the current one). Returns the highest resourceVersion seen.
///
/// # Errors
/// [`DevClusterError::CorruptState`] for a bad line that is not a cut last line;
/// [`DevClusterError::Io`].
pub fn replay(
    dir: &Path,
    snapshot_rv: u64,
    objects: &mut Vec<(ObjKey, Value)>,
) -> Result<u64, DevClusterError> {
    let mut files: Vec<PathBuf> = set_aside_journals(dir)?
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    files.push(dir.join(JOURNAL_FILE));
    let mut map: std::collections::BTreeMap<ObjKey, Value> =
        std::mem::take(objects).into_iter().collect();
    let mut highest = snapshot_rv;
    for path in files {
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(&path)(e)),
        };
        let complete = bytes.last() == Some(&b'\n');
        let lines: Vec<&[u8]> = bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .collect();
        let count = lines.len();
        for (i, line) in lines.into_iter().enumerate() {
            let parsed = serde_json::from_slice::<Value>(line).ok().and_then(|v| {
                let rv = v["rv"].as_u64()?;
                let key = ObjKey {
                    storage: Arc::from(v["storage"].as_str()?),
                    namespace: v["namespace"].as_str()?.to_string(),
                    name: v["name"].as_str()?.to_string(),
                };
                Some((rv, key, v["object"].clone()))
            });
            let Some((rv, key, object)) = parsed else {
                if i + 1 == count && !complete {
                    // Cut short by a crash: its request was never answered.
                    break;
                }
                return Err(DevClusterError::CorruptState {
                    path: path.clone(),
                    reason: format!("line {} is not a journal entry", i + 1),
                });
            };
            if rv <= snapshot_rv {
                continue;
            }
            highest = highest.max(rv);
            if object.is_object() {
                map.insert(key, object);
            } else {
                map.remove(&key);
            }
        }
    }
    *objects = map.into_iter().collect();
    Ok(highest)
}
