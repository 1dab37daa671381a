//! The `engine` package: the environment factory domain and the command line.
