"""One module per subcommand; they orchestrate core calls and render results, nothing more."""
