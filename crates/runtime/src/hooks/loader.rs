//! What the hooks do along each scan of the loaded modules (unwind::modules): the GOT survey
//! (got.rs) visits every object, and once the new snapshot is out, a CPython among the objects
//! (the executable, or a libpython loaded since) is looked for (python::detect). The unwinder
//! owns the scan; this module rides along it, registered before the run's first scan.

use std::path::Path;

use super::got::Survey;
use crate::unwind::modules::{self, ScanPass};

/// One scan's pass: the survey (none when its registry is poisoned).
struct LoaderPass {
    got: Option<Survey>,
}

impl ScanPass for LoaderPass {
    fn visit(&mut self, info: &libc::dl_phdr_info, path: &Path) {
        if let Some(got) = self.got.as_mut() {
            got.visit(info, path);
        }
    }

    fn finish(self: Box<Self>) {
        if let Some(got) = self.got {
            got.finish();
        }
        crate::python::detect();
    }
}

fn start_pass() -> Option<Box<dyn ScanPass>> {
    Some(Box::new(LoaderPass {
        got: Survey::begin(),
    }))
}

/// Rides along every scan from now on. Called before anything can scan: at the program's first
/// hooked allocation (inside it: nothing here allocates) and in the constructor.
pub fn ride_along() {
    let _ = modules::ride_along(start_pass);
}
