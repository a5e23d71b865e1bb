"""Authors' code transcribed for the tests (each module cites repository, path and commit); never imported by src/."""
