//! `ShapeKey`: the exact key of a graph variant.

use std::fmt;

/// An opaque, exact key selecting one captured variant of a [`Graph`](crate::Graph).
///
/// The caller owns the encoding (batch, sequence length, step index, ...); `exec` only
/// compares keys for equality. There is no bucketing: a key that was not captured is a
/// [`NoVariant`](crate::Error::NoVariant) error.
#[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShapeKey(pub u64);

impl ShapeKey {
    /// In a [`Plan`](crate::Plan) node, "use the key given to `execute`". Reserved: it cannot
    /// name a variant (`FRT_KEY_INHERIT` in the C ABI).
    pub const INHERIT: ShapeKey = ShapeKey(u64::MAX);

    /// Whether this is the [`INHERIT`](Self::INHERIT) sentinel.
    pub fn is_inherit(self) -> bool {
        self == Self::INHERIT
    }
}

impl fmt::Debug for ShapeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_inherit() {
            write!(f, "ShapeKey(INHERIT)")
        } else {
            write!(f, "ShapeKey({})", self.0)
        }
    }
}

impl fmt::Display for ShapeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl From<u64> for ShapeKey {
    fn from(v: u64) -> Self {
        ShapeKey(v)
    }
}
