"""SGLang's external model package while a WeDLM, NLD or Huginn checkpoint is served (`sglang_plugin.checkpoints`): each
module's `EntryClass` names the architecture it serves."""
