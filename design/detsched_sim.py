import heapq
P=132
def sim(order, L, lag=None, c=0.0):
    """order: list of (head, n). L[n]: steps. lag: min start gap (steps) after the previous
    tile of the same head in dQ order (prev = n-1 for ascending); None = no waits."""
    h=[0.0]*P; heapq.heapify(h); eff={}; idle=0.0
    for (hd,n) in order:
        t=heapq.heappop(h); e=t
        if lag is not None and (hd,n-1) in eff: e=max(t, eff[(hd,n-1)]+lag)
        idle+=e-t; eff[(hd,n)]=e
        heapq.heappush(h, e+L[n]+c)
    return max(h), idle
def orders(H,N,G,desc):
    seq=list(range(N-1,-1,-1)) if desc else list(range(N))
    out=[]
    for g0 in range(0,H,G):
        for n in seq:
            for hd in range(g0,min(H,g0+G)): out.append((hd,n))
    return out
def report(s,H,c=0.0):
    N=s//128; L=[2*N-2*n for n in range(N)]
    lb=(H*sum(L)+H*N*c)/P
    base,_=sim(orders(H,N,1,False),L,c=c)
    print(f"s{s} H={H} c={c}  W/P={lb:.0f}  default(head-major, n asc, no waits)={base:.0f} ({base/lb:.3f})")
    for G in (1,2,4,8,16):
        if G>H: break
        d,_=sim(orders(H,N,G,True),L,c=c)
        a,idle=sim(orders(H,N,G,False),L,lag=2.7,c=c)
        print(f"   G={G:2d}: descending={d:.0f} ({d/base:.3f}x default)   ascending+LPT, lag 2.7={a:.0f} ({a/base:.3f}x; idle {idle/(H*sum(L))*100:.1f}% of work)")
for s,H in [(16384,16),(8192,32),(4096,64),(1024,256)]:
    report(s,H)
