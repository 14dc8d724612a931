//! IO shell of the Sortie egress gateway: everything that touches a socket, a file or a clock.
