"""How the plugin runs inside fairseq's commands: one-line errors and --help, patches to fairseq,
the criteria's checkpointed clock, distributed wrappers."""
