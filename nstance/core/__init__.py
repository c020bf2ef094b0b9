"""Pure domain logic: identifiers, errors, durations, clocks and decisions. No I/O lives here."""
