//! An answer read within a bound (docs/design.md section 6, "Answers"; issue 34): whatever a
//! tool, agent, model or hook at a URL a run's author wrote sends back, the controller holds at
//! most [`MAX_ANSWER_BYTES`] of it (plus the chunk in hand), while the whole body is counted and
//! hashed as it streams by.
//!
//! Owns: the bound and the accumulator the HTTP readers (`tools::http`, `agents::webhook`,
//! `agents::openai`) feed chunk by chunk. It is sans-IO: the callers read the socket and decide
//! when to stop. Must not: grow past its bound, whatever is fed.

use sha2::{Digest, Sha256};

/// Most bytes of one answer kept to be parsed (4 MiB; the per-step content budget cuts what is
/// recorded far below this, keeping the full size and SHA-256). Past it, an answer is
/// `response_too_large` (a tool), an invalid decision (an agent or a model), or a failure (the
/// reconcile hook).
pub const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// Most bytes of an answer over the bound kept as its `head`, for the record to show.
pub const HEAD_BYTES: usize = 1024;

/// An answer's body fed chunk by chunk: the first `keep` bytes kept, every byte counted and
/// hashed.
#[derive(Debug, Clone)]
pub struct AnswerBody {
    keep: usize,
    kept: Vec<u8>,
    over: bool,
    hasher: Sha256,
    bytes: u64,
}

/// What was read of an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadAnswer {
    /// The whole body, when it was within the bound; `None` when it was over it.
    pub body: Option<Vec<u8>>,
    /// The first bytes of the body: all of it when within the bound, else at most
    /// [`HEAD_BYTES`].
    pub head: Vec<u8>,
    /// Bytes read.
    pub bytes: u64,
    /// `sha256:<hex>` of the bytes read.
    pub sha256: String,
}

impl AnswerBody {
    /// An empty answer keeping at most `keep` bytes.
    pub fn new(keep: usize) -> AnswerBody {
        AnswerBody {
            keep,
            kept: Vec::new(),
            over: false,
            hasher: Sha256::new(),
            bytes: 0,
        }
    }

    /// Counts and hashes `chunk`, and keeps it while the body is within the bound. The kept
    /// buffer grows by doubling, never past the bound; once over, all but the head is dropped.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.hasher.update(chunk);
        self.bytes = self
            .bytes
            .saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
        if self.over {
            return;
        }
        let want = self.kept.len().saturating_add(chunk.len());
        if want > self.keep {
            self.over = true;
            let head = HEAD_BYTES.min(self.keep);
            if self.kept.len() < head {
                let room = head - self.kept.len();
                self.kept
                    .extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or_default());
            }
            self.kept.truncate(head);
            self.kept.shrink_to_fit();
            return;
        }
        if want > self.kept.capacity() {
            let grown = self
                .kept
                .capacity()
                .saturating_mul(2)
                .max(want)
                .min(self.keep);
            self.kept.reserve_exact(grown - self.kept.len());
        }
        self.kept.extend_from_slice(chunk);
    }

    /// Whether more than the bound has been fed.
    pub fn over(&self) -> bool {
        self.over
    }

    /// Bytes fed so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes held now (never more than the bound).
    pub fn held(&self) -> usize {
        self.kept.capacity()
    }

    /// What was read.
    pub fn finish(self) -> ReadAnswer {
        let sha256 = format!("sha256:{}", hex::encode(self.hasher.finalize()));
        if self.over {
            ReadAnswer {
                body: None,
                head: self.kept,
                bytes: self.bytes,
                sha256,
            }
        } else {
            ReadAnswer {
                head: self.kept.clone(),
                body: Some(self.kept),
                bytes: self.bytes,
                sha256,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::canonical::sha256_tagged;

    #[test]
    fn an_answer_within_the_bound_is_kept_whole_with_its_size_and_hash() {
        let mut answer = AnswerBody::new(10);
        answer.feed(b"hello ");
        answer.feed(b"you!");
        assert!(!answer.over());
        let read = answer.finish();
        assert_eq!(read.body.as_deref(), Some(&b"hello you!"[..]));
        assert_eq!(read.bytes, 10);
        assert_eq!(read.sha256, sha256_tagged(b"hello you!"));
    }

    #[test]
    fn an_answer_over_the_bound_keeps_its_head_and_hashes_every_byte_holding_no_more() {
        let keep = 64 * 1024;
        let mut answer = AnswerBody::new(keep);
        let chunk = vec![b'x'; 8 * 1024];
        let mut whole = Sha256::new();
        for _ in 0..1000 {
            answer.feed(&chunk);
            whole.update(&chunk);
            assert!(answer.held() <= keep, "{}", answer.held());
        }
        assert!(answer.over());
        let read = answer.finish();
        assert_eq!(read.body, None);
        assert_eq!(read.head, vec![b'x'; HEAD_BYTES]);
        assert_eq!(read.bytes, 8 * 1024 * 1000);
        assert_eq!(
            read.sha256,
            format!("sha256:{}", hex::encode(whole.finalize()))
        );
    }

    #[test]
    fn the_bound_is_exact_one_byte_more_is_over() {
        let mut at = AnswerBody::new(4);
        at.feed(b"ab");
        at.feed(b"cd");
        assert_eq!(at.finish().body.as_deref(), Some(&b"abcd"[..]));
        let mut past = AnswerBody::new(4);
        past.feed(b"abcde");
        let read = past.finish();
        assert_eq!((read.body, read.head), (None, b"abcd".to_vec()));
    }
}
