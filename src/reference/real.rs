//! The working precision of the reference computations: [`Real`], implemented by f32 (what the
//! kernels compute in) and f64 (the oracle). Its own module so that attention, the merges and the
//! sink arithmetic all use it without depending on one another.

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, Sub};

/// The working precision of a reference computation: f32 (what kernels do) or f64 (the oracle
/// for tolerance checks).
pub trait Real:
    Copy
    + Debug
    + Default
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + AddAssign
    + Send
    + Sync
    + 'static
{
    const ZERO: Self;
    const ONE: Self;
    const NEG_INFINITY: Self;
    const INFINITY: Self;
    const NAN: Self;
    const LN_2: Self;
    fn from_f32(x: f32) -> Self;
    fn to_f64(self) -> f64;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    fn abs(self) -> Self;
    fn is_nan(self) -> bool;
}

macro_rules! impl_real {
    ($t:ident) => {
        impl Real for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NEG_INFINITY: Self = $t::NEG_INFINITY;
            const INFINITY: Self = $t::INFINITY;
            const NAN: Self = $t::NAN;
            const LN_2: Self = std::$t::consts::LN_2;
            fn from_f32(x: f32) -> Self {
                x as $t
            }
            fn to_f64(self) -> f64 {
                self as f64
            }
            fn exp(self) -> Self {
                $t::exp(self)
            }
            fn ln(self) -> Self {
                $t::ln(self)
            }
            fn abs(self) -> Self {
                $t::abs(self)
            }
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
        }
    };
}
impl_real!(f32);
impl_real!(f64);
