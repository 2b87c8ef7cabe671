//! The base every layer uses: the configuration ([`config`]), logging ([`log`]), process-wide
//! flags ([`flags`]), the driver's types ([`cu`], types only), the user's runtime directory
//! ([`rundir`], found by [`rundir_find`]), the files it writes where a user points it ([`outfile`]), reads and writes at an offset that never map ([`pio`]), how long a reader of others' files waits ([`patience`]), what another process is doing ([`procstate`]), host memory a sleep keeps ([`host_copy`]), a job's share in the mandatory mode ([`job`]), descriptors across processes ([`fds`]), shared files cut under a mapping ([`sigbus`]), and support code ([`addr_hash`], [`per_thread`], [`sync`], [`frames`]). None of
//! it knows pools, limits or the driver's functions.

pub mod addr_hash;
pub mod config;
pub mod cu;
pub mod fds;
pub mod flags;
pub mod frames;
pub mod host_copy;
pub mod host_room;
pub mod in_flight;
pub mod job;
pub mod limit;
pub mod log;
pub mod outfile;
pub mod patience;
pub mod per_thread;
pub mod pio;
pub mod procstate;
pub mod rundir;
pub mod rundir_find;
pub mod sigbus;
pub mod sync;
