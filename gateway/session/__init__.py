"""What every protocol session shares: the skeleton (bytes in, events to the
protocol's handler table, outbox out, deadlines), its timers, its flow
control and the outbox.  Sans-IO and synchronous."""
