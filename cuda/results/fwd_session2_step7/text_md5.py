import subprocess,re,sys,hashlib
def texts(f):
    data=open(f,'rb').read()
    i=data.find(b'\x7fELF',1)
    while i!=-1:
        open('/tmp/fwd4w/_y.cubin','wb').write(data[i:])
        r=subprocess.run(['readelf','-S','-W','/tmp/fwd4w/_y.cubin'],capture_output=True,text=True).stdout
        res={}
        for m in re.finditer(r'\]\s+(\.text\.\S+)\s+\S+\s+\S+\s+([0-9a-f]+)\s+([0-9a-f]+)',r):
            k=re.search(r'FastTraitsILi(\d+)ELb(\d)EEELb(\d)',m.group(1))
            off,sz=int(m.group(2),16),int(m.group(3),16)
            res[k.groups()]=hashlib.md5(data[i+off:i+off+sz]).hexdigest()[:10]
        if res: return res
        i=data.find(b'\x7fELF',i+1)
ref=texts('/tmp/fwd4w/a.cubin') if False else None
for f in sys.argv[1:]:
    print(f, texts(f))
