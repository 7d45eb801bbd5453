//! A hooked CUDA function: a small pool of wrapper instances, each bound to one real function.
//!
//! Instance 0 is the exported symbol (direct linking); its real function is looked up by name
//! the first time it runs. Instances 1.. are handed out by `dlsym` and `cuGetProcAddress`,
//! each claimed by the real pointer it wraps, so two different real functions under one name
//! (`cuLaunchKernel` and its per-thread-stream variant) each keep their own wrapper. When the
//! pool is used up, the real function is handed out unwrapped: calls then go unrecorded, never
//! wrong.

use std::ffi::CStr;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::resolve;
use super::Layer;

pub const INSTANCES: usize = 4;

pub struct Hook<F: Copy + 'static> {
    symbol: &'static CStr,
    layer: Layer,
    real: [AtomicUsize; INSTANCES],
    wrappers: [F; INSTANCES],
}

/// What the lookup paths need of a hook, whatever its signature.
#[cfg_attr(any(test, not(target_arch = "x86_64")), allow(dead_code))] // see dlsym.rs
pub trait Wrap: Sync {
    /// The wrapper to hand out in place of `real` (`real` itself when none is free).
    fn wrap(&self, real: usize) -> usize;
    /// The exported symbol's real function, looked up now if needed (0: none in the process).
    fn exported_real(&self) -> usize;
    /// The exported symbol's address.
    fn exported(&self) -> usize;
}

impl<F: Copy + Sync + 'static> Hook<F> {
    pub const fn new(symbol: &'static CStr, layer: Layer, wrappers: [F; INSTANCES]) -> Hook<F> {
        Hook {
            symbol,
            layer,
            real: [const { AtomicUsize::new(0) }; INSTANCES],
            wrappers,
        }
    }

    /// The real function behind instance `i`.
    #[inline]
    pub fn real(&self, i: usize) -> Option<F> {
        let mut addr = self.real[i].load(Ordering::Acquire);
        if addr == 0 && i == 0 {
            addr = resolve::real_symbol(self.symbol, self.layer);
            if addr != 0 {
                self.real[0].store(addr, Ordering::Release);
            }
        }
        // SAFETY: `F` is a function pointer type (the size check holds) and `addr` is the real
        // function of this hook's signature, found under its name or handed to `wrap`.
        (addr != 0 && std::mem::size_of::<F>() == std::mem::size_of::<usize>())
            .then(|| unsafe { std::mem::transmute_copy::<usize, F>(&addr) })
    }

    fn wrapper(&self, i: usize) -> usize {
        // SAFETY: `F` is a function pointer type, the size of a usize.
        unsafe { std::mem::transmute_copy::<F, usize>(&self.wrappers[i]) }
    }
}

impl<F: Copy + Sync + 'static> Wrap for Hook<F> {
    fn wrap(&self, real: usize) -> usize {
        if real == 0 || (0..INSTANCES).any(|i| self.wrapper(i) == real) {
            return real;
        }
        if self.real[0].load(Ordering::Acquire) == real {
            return self.wrapper(0);
        }
        for i in 1..INSTANCES {
            match self.real[i].compare_exchange(0, real, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return self.wrapper(i),
                Err(bound) if bound == real => return self.wrapper(i),
                Err(_) => {}
            }
        }
        real
    }

    fn exported_real(&self) -> usize {
        self.real(0)
            // SAFETY: as in `real`.
            .map(|f| unsafe { std::mem::transmute_copy::<F, usize>(&f) })
            .unwrap_or(0)
    }

    fn exported(&self) -> usize {
        self.wrapper(0)
    }
}

/// `[f::<0>, f::<1>, ...]` with instance 0 replaced by the exported function.
macro_rules! instances {
    ($export:ident, $inst:ident, $t:ty) => {
        [
            $export as $t,
            $inst::<1> as $t,
            $inst::<2> as $t,
            $inst::<3> as $t,
        ]
    };
}

/// Defines a hooked function: its signature type, the [`Hook`] static, the exported symbol
/// (instance 0) and the generic instance. The body sees the arguments and `$real`, the real
/// function, and returns the result; `$missing` is returned when no real function exists.
macro_rules! cuda_hook {
    (
        $(#[$doc:meta])*
        $hook:ident: $fnty:ident = $export:ident / $inst:ident, $layer:expr,
        ($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty, missing = $missing:expr,
        |$real:ident| $body:block
    ) => {
        type $fnty = unsafe extern "C" fn($($ty),*) -> $ret;

        pub(super) static $hook: $crate::hooks::cuda::hook::Hook<$fnty> = $crate::hooks::cuda::hook::Hook::new(
            match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($export), "\0").as_bytes()) {
                Ok(name) => name,
                Err(_) => panic!("symbol name"),
            },
            $layer,
            $crate::hooks::cuda::hook::instances!($export, $inst, $fnty),
        );

        $(#[$doc])*
        ///
        /// # Safety
        /// The contract of the CUDA function of this name.
        #[cfg_attr(not(test), no_mangle)]
        #[allow(non_snake_case, clippy::too_many_arguments)]
        pub unsafe extern "C" fn $export($($arg: $ty),*) -> $ret {
            // SAFETY: instance 0 has this function's contract, which our caller upholds; the
            // arguments are passed on unchanged.
            unsafe { $inst::<0>($($arg),*) }
        }

        /// Instance `I`: calls the real function bound to it.
        ///
        /// # Safety
        /// The contract of the CUDA function this hook wraps. The body calls `$real` in its own
        /// `unsafe` blocks, each passing the caller's arguments on under that contract.
        #[allow(clippy::too_many_arguments)]
        unsafe extern "C" fn $inst<const I: usize>($($arg: $ty),*) -> $ret {
            let Some($real) = $hook.real(I) else {
                return $missing;
            };
            $body
        }
    };
}

pub(crate) use cuda_hook;
pub(crate) use instances;
