//! The hash map of the analyses. Their keys (pointers, devices, thread ids, owner names) are
//! hashed on nearly every row of a dump, where SipHash is a large part of an analysis's cost;
//! foldhash is several times quicker and still seeded at random per map, so a dump built to
//! collide cannot turn the maps quadratic.

pub type FastMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
