//! A new run kept whole from the watch event that delivered it ([`FreshRun`]), until a
//! controller first writes its status: its reconcile takes this object instead of reading the
//! run, and the compare-and-set of that first write on the event's resourceVersion is the
//! fence (docs/design.md section 7). The JSON text kept is bounded per process
//! ([`FRESH_BUDGET_BYTES`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::Value;

use crate::controller::cluster::{DecodeError, StoredRun};

/// The bytes of JSON text a replica process keeps at most in [`FreshRun`]s (12 MiB: about
/// 5,000 runs of a 2 KiB spec each, their managedFields dropped); a new run beyond it is read
/// by its reconcile, as every run was before (issue 15). With 8 MiB, 10,000 new runs across
/// 3 replicas left about 700 of each replica's own runs to be read.
pub const FRESH_BUDGET_BYTES: usize = 12 << 20;

/// Past this many bytes of [`FreshRun`]s alive (a quarter of [`FRESH_BUDGET_BYTES`]), a new
/// run is kept only by the replica its uid ranks first among the replicas seen
/// ([`crate::controller::spread::place`]): the one that tries it first and whose free slots go to such
/// runs first, so the rest of the budget holds the runs this replica most likely starts.
/// Kept by every replica below it: the one that ranks first may have no slot free, and
/// another then starts the run.
pub const FRESH_OTHERS_BYTES: usize = FRESH_BUDGET_BYTES / 4;

/// The bytes of [`FreshRun`] text alive in this process.
pub(super) static FRESH_BYTES: AtomicUsize = AtomicUsize::new(0);

/// A new run's whole object (apiVersion, kind, metadata with its resourceVersion, spec, and
/// its status when that is the CRD's default `{phase: Pending, ...}`) as JSON text, from the
/// watch event that delivered it (issue 15: the reconcile that starts a new run reads
/// nothing). Its `metadata.managedFields` are dropped (about 40% of a new run's object on
/// kube-apiserver) and only their length is kept, counted back into the run's
/// `metadata_bytes` for the object budget; a status write without managedFields leaves the
/// stored ones as they are. Its first status write is a compare-and-set on that
/// resourceVersion, so a run that changed since the event (a spec edit, another replica's
/// write) is refused with 409 and read again: the text is never trusted beyond what the API
/// server confirms (docs/design.md section 7).
#[derive(Clone)]
pub struct FreshRun(Arc<FreshText>);

/// The text, the length of the managedFields dropped from it, and the count of live bytes it
/// is counted in (given back when it is dropped).
struct FreshText {
    text: Box<str>,
    managed_fields_bytes: usize,
    account: &'static AtomicUsize,
}

impl Drop for FreshText {
    fn drop(&mut self) {
        self.account.fetch_sub(self.text.len(), Ordering::Relaxed);
    }
}

impl std::fmt::Debug for FreshRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FreshRun({} bytes)", self.0.text.len())
    }
}

impl FreshRun {
    /// Keeps `object` as text without its managedFields, counted in `account`; `None` when
    /// that would take the count over `budget` bytes (or it does not serialize).
    pub(super) fn keep(
        mut object: Value,
        managed_fields_bytes: usize,
        account: &'static AtomicUsize,
        budget: usize,
    ) -> Option<FreshRun> {
        let managed_fields_bytes =
            managed_fields_bytes + crate::controller::cluster::take_managed_fields(&mut object);
        let text = serde_json::to_string(&object).ok()?;
        let len = text.len();
        let before = account.fetch_add(len, Ordering::Relaxed);
        if before.saturating_add(len) > budget {
            account.fetch_sub(len, Ordering::Relaxed);
            return None;
        }
        Some(FreshRun(Arc::new(FreshText {
            text: text.into_boxed_str(),
            managed_fields_bytes,
            account,
        })))
    }

    /// The run as stored when the event was made, without its managedFields, whose length
    /// `snapshot.metadata_bytes` counts all the same.
    ///
    /// # Errors
    /// A [`DecodeError`] when the text does not decode as a run (its spec does not, or its
    /// metadata lacks a uid or resourceVersion): the caller reads the run instead.
    pub fn stored(&self) -> Result<StoredRun, DecodeError> {
        let object: Value =
            serde_json::from_str(&self.0.text).map_err(|source| DecodeError::Text {
                run: String::from("(watched)"),
                cause: crate::controller::cluster::bounded_cause(&source),
            })?;
        let mut run = StoredRun::from_object(object)?;
        run.snapshot.metadata_bytes = run
            .snapshot
            .metadata_bytes
            .saturating_add(self.0.managed_fields_bytes);
        Ok(run)
    }

    /// The bytes of [`FreshRun`] text alive in this process.
    pub fn bytes_alive() -> usize {
        FRESH_BYTES.load(Ordering::Relaxed)
    }
}
