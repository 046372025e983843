//! One module per subcommand.

pub mod archive;
pub mod audit;
pub mod client;
pub mod doctor;
pub mod inspect;
pub mod replay;
pub mod run;
pub mod serve;
pub mod validate;
