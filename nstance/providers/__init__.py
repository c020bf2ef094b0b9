"""VM providers behind one protocol: local processes, a deterministic simulator, AWS, GCP, Proxmox."""
