"""Text that leaves the process: redaction of secrets, escaping of target values, Nagios output."""
