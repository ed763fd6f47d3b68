//! Integer strategies weighted towards the edges where arithmetic overflows, for the property
//! tests that feed public entry points any integers (tests/planner.rs, ffi/tests/fuzz.rs).

use proptest::prelude::*;

/// usize: small values, the sizes the checks accept (block, top-k), and the edges of the types.
pub fn any_usize() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..20,
        Just(64usize),
        Just(256usize),
        Just(2048usize),
        Just(usize::MAX),
        Just(usize::MAX / 2 + 1),
        Just(1usize << 31),
        Just((1usize << 32) + 1),
        Just((1usize << 63) + 1),
        any::<usize>()
    ]
}

/// u64: small values, the int32 edge and beyond, and the type's edge.
pub fn any_u64() -> impl Strategy<Value = u64> {
    prop_oneof![0u64..20, Just(u64::MAX), Just(1u64 << 31), Just(i32::MAX as u64 + 1), Just(1u64 << 40), any::<u64>()]
}
