//! Every port call has a deadline on the `Clock` port (K-6.8): a hung port ends its call at the
//! deadline, so no claim and no maintenance pass waits on it.

mod hung_ports;
mod side_ports;
