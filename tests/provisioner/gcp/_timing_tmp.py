import time, tests.fixtures.control_plane as cpm
orig = cpm.ControlPlane.provision
def timed(self, *a, **k):
    t=time.monotonic(); r=orig(self,*a,**k); print(f"TIMING {time.monotonic()-t:.2f}s provision {' '.join(a[:4])}", flush=True); return r
cpm.ControlPlane.provision = timed
import tests.provisioner.gcp.test_control_plane as t
ou = t.until
def tu(what, *a, **k):
    s=time.monotonic(); r=ou(what,*a,**k); print(f"TIMING {time.monotonic()-s:.2f}s until {what}", flush=True); return r
t.until = tu
