"""Where consumed messages go (files now; more later). No click or rich here."""
