//! Element types and their f32 conversions (the host backend computes in f32).

use half::{bf16, f16};

/// The element type of a [`Tensor`](crate::Tensor).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    F16,
    I32,
    U8,
    /// FP8 E4M3 codes (see [`fp8`](crate::fp8)): GEMM operands with scales kept beside them.
    E4M3,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::BF16 | DType::F16 => 2,
            DType::U8 | DType::E4M3 => 1,
        }
    }

    /// The suffix of CUDA entry points (`rms_norm_bf16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::E4M3 => "e4m3",
        }
    }

    /// f32, bf16 or f16.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::BF16 | DType::F16)
    }
}

/// A floating-point storage type the host backend loads into f32 and stores from f32.
pub(crate) trait Float: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl Float for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl Float for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl Float for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// Runs `$body` with `$T` bound to the Rust storage type of float dtype `$dt`.
macro_rules! with_float {
    ($dt:expr, $T:ident, $body:block) => {
        match $dt {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            other => unreachable!("{other:?} is not a float type (checked before)"),
        }
    };
}
pub(crate) use with_float;
