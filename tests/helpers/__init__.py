"""What several test modules share: jobs run through the command line, processes watched,
AWS under moto, data-parallel ranks."""
