//! The two backends behind one API: `host` (the reference, CI, laptops) and `cuda` (the
//! product). `Ctx` picks one at creation; everything else dispatches on it.

pub(crate) mod cuda;
pub(crate) mod host;
pub(crate) mod memset_nodes;
