//! placeholder
use super::*;
#[allow(unused)]
fn _x() -> Option<Solo> {
    None
}
