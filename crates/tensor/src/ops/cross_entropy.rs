//! Sparse cross-entropy (filled in by the cross-entropy work).

use crate::ops::Diff;

/// Cross-entropy losses.
pub trait CrossEntropyOps: Diff {}

impl<T: Diff> CrossEntropyOps for T {}
