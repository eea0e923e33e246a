//! Sessions (`SandboxSession`): an agent's state kept between python calls, in one sandbox
//! Pod only that agent's calls use. [`controller`] gives each session its Pod and ends it
//! ([`lifecycle`] says when, [`pod`] builds the Pod); a run in a session makes its call there
//! ([`call`], talking to the session's runner through [`exchange`]).

pub mod call;
pub mod controller;
pub mod exchange;
pub mod lifecycle;
pub mod pod;
