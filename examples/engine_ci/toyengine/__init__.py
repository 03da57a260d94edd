"""toyengine: a stand-in for an inference engine's repository, to show kvsim's pytest plugin in its CI."""
