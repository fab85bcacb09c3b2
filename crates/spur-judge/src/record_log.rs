//! A bounded queue of records that the world appends to and a check takes from: the API
//! server's applied writes and the controller replicas' write calls.

use std::collections::VecDeque;

/// Records kept until a reader takes them. A scenario's checks take them every sample
/// (250 ms), when a few dozen at most are waiting; a test that never reads stops recording
/// here instead of growing without bound, and the loss is counted so a check can refuse to
/// judge an incomplete record.
pub const RECORD_LOG_LIMIT: usize = 65_536;

/// Records not yet taken, oldest first, bounded by [`RECORD_LOG_LIMIT`].
#[derive(Debug)]
pub struct RecordLog<T> {
    records: VecDeque<T>,
    dropped: u64,
}

impl<T> Default for RecordLog<T> {
    fn default() -> Self {
        Self {
            records: VecDeque::new(),
            dropped: 0,
        }
    }
}

impl<T> RecordLog<T> {
    pub fn push(&mut self, record: T) {
        if self.records.len() >= RECORD_LOG_LIMIT {
            self.dropped += 1;
            return;
        }
        self.records.push_back(record);
    }

    /// Takes every record so far, in the order recorded.
    pub fn take(&mut self) -> Vec<T> {
        self.records.drain(..).collect()
    }

    /// Records lost because nobody took them in time.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_bounded_and_counts_what_it_lost() {
        let mut log = RecordLog::default();
        for i in 0..(RECORD_LOG_LIMIT as u64 + 3) {
            log.push(i);
        }
        assert_eq!(log.dropped(), 3);
        let taken = log.take();
        assert_eq!(taken.len(), RECORD_LOG_LIMIT);
        assert_eq!(taken[0], 0, "oldest first");
        assert!(log.take().is_empty());
    }
}
